--[[
delegate's slurmctld gate (JobSubmitPlugins=lua; Slurm 22.05 reads
job_submit.lua from the directory of slurm.conf). Installed by
build_cluster.sh as `delegate-deploy gate` renders it: the site's settings
(slurm-conf/job_submit.settings.lua.j2: RUNNER, JOB_ROOTS, ADMIN_GROUP,
ADMIN_UIDS, MAX_MAP_MINUTES, PARTITIONS) followed by this file
(root-owned, 0644).

On a cluster shared with plain Slurm jobs (the site policy's `partitions`,
rendered as PARTITIONS) everything below applies only in delegate's
partitions: a job that goes only to other partitions returns at once,
untouched (unless it is one of delegate's forms); see "delegate's
partitions" below.
Unit tests: tests/lua/job_submit_test.lua.

Users who are not cluster admins (root, SlurmUser, members of the admin
group) may only submit batch jobs whose script is byte for byte one of the
forms delegate's client generates (broker/client/src/slurm/script.rs:
batch_script, array_script, pull_script), REGENERATED here from the paths
parsed out of the script and compared whole. Everything else is refused, with
a one-line reason the user sees ("sbatch: error: delegate: ..."):
  - salloc / srun allocations (they reach this hook with script == nil),
  - sbatch --wrap and any other script,
  - --get-user-env, --export=NONE, --export=<list> (sbatch then sets
    SLURM_GET_USER_ENV and slurmd, as root, runs `su - <user> -c env` on the
    worker: the user's login files, outside any step and any sandbox),
  - --container, heterogeneous jobs, script arguments, more than one node
    (except the multi-node form below, and then exactly its own node count),
    --uid of another user, an --array that is not the script's own,
  - a GPU (generic resource) request that is not the script's own
    "#SBATCH --gres=gpu:N" line (--gres on the command line, --gpus,
    --gpus-per-task/-socket): the root agent passes the allocation's GPUs
    into the sandbox and checks their number against the spec and the
    site policy; the gate keeps the request where delegate put it.
The job's comment is set here, from the script, to "delegate:calls=N" (the
number of job directories it runs; the instructor's `delegate admin usage`
counts calls by it), whatever the submitter sent. A user's later update
(slurm_job_modify) may not change the comment, the node count or the GPUs.
The multi-node form ("#SBATCH --nodes=N" and `exec <runner> ranks <dir>`)
runs `srun ... <runner> rank <dir>` from the runner; the SPANK plugin admits
exactly that step argv. Job steps never reach this hook: the SPANK plugin
(slurm-conf/spank/delegate_lockdown.c) refuses them in slurmstepd.

FAIL CLOSED. In 22.05 a Lua runtime error in slurm_job_submit, or a return
value that is not a number, makes job_submit_lua.c ACCEPT the job (its rc
stays SLURM_SUCCESS). So every check runs under pcall and any error is a
refusal. A script that fails to load keeps the previously loaded one
(slurm_lua_loadscript: "using previous script"); with none loaded at all,
every submission fails.
--]]

-- ---- bounds of the gate itself ---------------------------------------------
-- Bytes; Slurm's own bound (max_script_size) is 4 MiB and is checked after
-- this hook, so the hook bounds the script itself before it parses it.
local MAX_SCRIPT  = 1024 * 1024
local MAX_ARRAY   = 100000
-- The site's settings (RUNNER, JOB_ROOTS, ADMIN_GROUP, ADMIN_UIDS,
-- MAX_MAP_MINUTES) are locals defined above this file by the renderer.
-- -------------------------------------------------------------------------------

-- Lua 5.1 (what Debian's Slurm 22.05 and 24.11 link) to 5.4 (a Slurm built with a newer Lua).
local unpack = table.unpack or unpack

local NO_VAL = 4294967294  -- 0xfffffffe
local NO_VAL16 = 65534     -- 0xfffe

-- The admin group's gid and members (/etc/group) and every account's primary
-- gid (/etc/passwd), re-read at most every 60 s. Never the job's group_id:
-- that is what the submitting client says. (Lua 5.1 has no getgrouplist;
-- with LDAP/SSSD accounts, mirror the admin group into /etc/group on the
-- controller or list the admins' uids in ADMIN_UIDS.)
local GROUP_FILE, PASSWD_FILE = "/etc/group", "/etc/passwd"
local cache = { t = -1 }
local function accounts()
   local now = os.time()
   if now - cache.t < 60 then return cache end
   local gid, members, primary, names = nil, {}, {}, {}
   local f = io.open(GROUP_FILE, "r")
   if f then
      for line in f:lines() do
         local name, g, list = line:match("^([^:]*):[^:]*:(%d+):(.*)$")
         if name == ADMIN_GROUP then
            gid = tonumber(g)
            for m in list:gmatch("[^,%s]+") do members[m] = true end
         end
      end
      f:close()
   end
   f = io.open(PASSWD_FILE, "r")
   if f then
      for line in f:lines() do
         local name, u, g = line:match("^([^:]*):[^:]*:(%d+):(%d+):")
         if name then
            primary[name] = tonumber(g)
            names[tonumber(u)] = names[tonumber(u)] or name
         end
      end
      f:close()
   end
   cache = { t = now, gid = gid, members = members, primary = primary, names = names }
   return cache
end

local function name_is_admin(name)
   local a = accounts()
   if a.gid == nil or name == nil then return false end
   return a.members[name] == true or a.primary[name] == a.gid
end

local function is_admin(submit_uid, job_desc)
   if ADMIN_UIDS[submit_uid] then return true end
   -- Only root may submit as another uid (--uid); such a job is refused below.
   if job_desc.user_id ~= submit_uid then return false end
   return name_is_admin(job_desc.user_name)   -- derived by slurmctld from user_id
end

-- A modification's uid is slurmctld's (the RPC's authenticated uid); its
-- name comes from /etc/passwd, never from the request.
local function uid_is_admin(uid)
   if ADMIN_UIDS[uid] then return true end
   return name_is_admin(accounts().names[uid])
end

-- The comment every delegate job carries: its number of calls (script.rs:
-- sbatch_args, usage.rs: CALLS_COMMENT).
local CALLS_COMMENT = "delegate:calls="

-- ---- the generated forms (identical to broker/client/src/slurm/script.rs) ----
local function q(s) return "'" .. s .. "'" end   -- shell_quote of a quote-free s

local function batch_script(runner, dir)
   return "#!/bin/sh\nexec " .. q(runner) .. " " .. q(dir) .. "\n"
end

local function array_script(runner, dirs, logs)
   local t = { "#!/bin/sh\n#SBATCH --array=0-" .. (#dirs - 1) .. "\n",
               "case \"$SLURM_ARRAY_TASK_ID\" in\n" }
   for i = 1, #dirs do
      t[#t + 1] = (i - 1) .. ") exec >>" .. q(logs[i]) .. " 2>&1; exec "
                  .. q(runner) .. " " .. q(dirs[i]) .. " ;;\n"
   end
   t[#t + 1] = "esac\necho \"delegate: no job directory for array task $SLURM_ARRAY_TASK_ID\" >&2\nexit 1\n"
   return table.concat(t)
end

-- script.rs: ranks_script (a multi-node rank job, nodes > 1)
local function ranks_script(runner, dir, nodes)
   return "#!/bin/sh\n#SBATCH --nodes=" .. nodes .. "\nexec " .. q(runner) .. " ranks " .. q(dir) .. "\n"
end
local MAX_NODES = 256

-- script.rs: pull_script (a map's allocations, each given every call)
local function pull_script(runner, dirs, allocations)
   local t = { "exec " .. q(runner) .. " pull" }
   for _, d in ipairs(dirs) do t[#t + 1] = q(d) end
   local line = table.concat(t, " ")
   if allocations == 1 then return "#!/bin/sh\n" .. line .. "\n" end
   return "#!/bin/sh\n#SBATCH --array=0-" .. (allocations - 1) .. "\n" .. line .. "\n"
end

-- ---- paths ---------------------------------------------------------------------
-- Only these bytes may appear in a path: no quote, newline, backslash, '$',
-- space or glob. Inside '...' sh interprets nothing anyway; the allowlist
-- keeps the line-based parser unambiguous. The client refuses a delegate root
-- with other bytes before it submits (the same set).
local function safe_path(p)
   if not p:match("^/[A-Za-z0-9._/+@=,:%-]+$") then return false end
   if p:find("//", 1, true) or p:find("/./", 1, true) or p:find("/../", 1, true)
      or p:match("/%.%.?$") or p:match("/$") then return false end
   return true
end

local function job_dir_ok(d)
   if not safe_path(d) then return false end
   -- the basename is a delegate job id: YYYYMMDDTHHMMSS-xxxxxxxx
   if not d:match("/%d%d%d%d%d%d%d%dT%d%d%d%d%d%d%-%x%x%x%x%x%x%x%x$") then return false end
   for _, r in ipairs(JOB_ROOTS) do
      if d:sub(1, #r + 1) == r .. "/" then return true end
   end
   return false
end

-- "'a' 'b' 'c'" -> { "a", "b", "c" }; nil on anything else.
local function quoted_words(s)
   local words, pos = {}, 1
   while pos <= #s do
      local w, nextpos = s:match("^'([^']*)' ?()", pos)
      if not w then return nil end
      words[#words + 1] = w
      pos = nextpos
   end
   return words
end

-- An exec line's body (after "exec "): kind ("single" | "shared"), dirs.
local function parse_exec(body)
   local quoted = body:gsub(" pull ", " 'pull' ", 1)
   local w = quoted_words(quoted)
   if not w or w[1] ~= RUNNER or #w < 2 then return nil end
   if w[2] == "pull" then
      if #w < 3 then return nil end
      return "map", { unpack(w, 3) }
   end
   if #w ~= 2 then return nil end
   return "single", { w[2] }
end

-- The optional GPU line right after "#!/bin/sh" (script.rs: with_gpus):
-- the number of GPUs (0 without the line) and the script without it.
local MAX_GPUS_LINE = 64
local function split_gpus(script)
   local g = script:match("^#!/bin/sh\n#SBATCH %-%-gres=gpu:([1-9]%d*)\n")
   if not g then return 0, script end
   local n = tonumber(g)
   if #g > 3 or n == nil or n > MAX_GPUS_LINE then return nil, script end
   return n, "#!/bin/sh\n" .. script:sub(#("#!/bin/sh\n#SBATCH --gres=gpu:" .. g .. "\n") + 1)
end

local function with_gpus(script, gpus)
   if gpus == 0 then return script end
   return "#!/bin/sh\n#SBATCH --gres=gpu:" .. gpus .. "\n" .. script:sub(#"#!/bin/sh\n" + 1)
end

-- The multi-node form: nil when `whole` is not one, else (reason) or
-- (false, nodes).
local function check_ranks(whole, array_inx)
   local n, body = whole:match("^#!/bin/sh\n#SBATCH %-%-nodes=([1-9]%d?%d?)\nexec ([^\n]*)\n$")
   if not n then return nil end
   local nodes = tonumber(n)
   if nodes < 2 or nodes > MAX_NODES then return "a multi-node job has 2 to " .. MAX_NODES .. " nodes" end
   if array_inx ~= nil and array_inx ~= "" then return "--array is not allowed with this script" end
   local w = quoted_words((body:gsub(" ranks ", " 'ranks' ", 1)))
   if not w or #w ~= 3 or w[1] ~= RUNNER or w[2] ~= "ranks" then return "not a delegate script" end
   if not job_dir_ok(w[3]) then
      return "job directory not allowed (not a job id below " .. table.concat(JOB_ROOTS, ", ")
             .. ", or bytes outside A-Z a-z 0-9 . _ / + @ = , : -): " .. w[3]:sub(1, 200)
   end
   if ranks_script(RUNNER, w[3], nodes) ~= whole then return "not a delegate script" end
   return false, nodes
end

-- nil when the script is one of delegate's forms, else the reason; second
-- value: the GPUs its own line asks for; third: the nodes (1 but for the
-- multi-node form); fourth: the calls it runs (its job directories);
-- fifth: whether it is a map's allocations (`sandbox-runner pull`).
local function check_script(whole, array_inx)
   if #whole > MAX_SCRIPT then return "the script is larger than a delegate script can be" end
   local rwhy, rnodes = check_ranks(whole, array_inx)
   if rwhy then return rwhy end
   if rwhy == false then return nil, 0, rnodes, 1, false end
   local gpus, script = split_gpus(whole)
   if gpus == nil then return "too many GPUs in the script's --gres line" end
   if script:sub(-1) ~= "\n" then return "not a delegate script" end
   local lines = {}
   for l in script:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
   if lines[1] ~= "#!/bin/sh" or #lines < 2 then return "not a delegate script" end

   local expected, dirs
   local map = false
   if lines[2]:sub(1, 5) == "exec " then
      if array_inx ~= nil and array_inx ~= "" then return "--array is not allowed with this script" end
      local kind, d = parse_exec(lines[2]:sub(6))
      if kind == "single" then expected = batch_script(RUNNER, d[1])
      elseif kind == "map" then expected = pull_script(RUNNER, d, 1); map = true
      else return "not a delegate script" end
      dirs = d
   else
      local n = tonumber(lines[2]:match("^#SBATCH %-%-array=0%-(%d+)$"))
      if not n or n + 1 > MAX_ARRAY then return "not a delegate script" end
      if array_inx ~= "0-" .. n then return "--array must be the script's own (0-" .. n .. ")" end
      if #lines == 3 and lines[3]:sub(1, 5) == "exec " then   -- pull_script, several allocations
         local kind, d = parse_exec(lines[3]:sub(6))
         if kind ~= "map" then return "not a delegate script" end
         if n + 1 > #d then return "a map has no more allocations than calls" end
         dirs, map = d, true
         expected = pull_script(RUNNER, d, n + 1)
      else                                                     -- array_script
         if #lines ~= n + 7 then return "not a delegate script" end
         local logs = {}
         dirs = {}
         for i = 1, n + 1 do
            local log, body = (lines[3 + i] or ""):match("^" .. (i - 1) .. "%) exec >>'([^']*)' 2>&1; exec (.*) ;;$")
            if not log then return "not a delegate script" end
            local kind, d = parse_exec(body)
            if kind ~= "single" then return "not a delegate script" end
            if log ~= d[1] .. ".log" then return "the log of a job must be its own <dir>.log" end
            dirs[i], logs[i] = d[1], log
         end
         expected = array_script(RUNNER, dirs, logs)
      end
   end
   for _, d in ipairs(dirs) do
      if not job_dir_ok(d) then
         return "job directory not allowed (not a job id below " .. table.concat(JOB_ROOTS, ", ")
                .. ", or bytes outside A-Z a-z 0-9 . _ / + @ = , : -): " .. d:sub(1, 200)
      end
   end
   if with_gpus(expected, gpus) ~= whole then return "not a delegate script" end
   return nil, gpus, 1, #dirs, map
end

-- nil when the job's generic-resource request is exactly the script's GPU
-- line (sbatch turns "--gres=gpu:N" into tres_per_node "gres:gpu:N").
-- Whether a TRES request names anything but CPUs: "cpu=2" is what Slurm
-- 23.02 and later put in tres_per_task for --cpus-per-task (delegate's
-- --cpus), "gres/gpu:1" or "cpu=2,gres/gpu=1" is a GPU request.
local function beyond_cpus(tres)
   if tres == nil or tres == "" then return false end
   for item in (tres .. ","):gmatch("([^,]*),") do
      if not item:match("^cpu[=:]%d+$") then return true end
   end
   return false
end

local function check_gres(job_desc, gpus)
   local function set(v) return v ~= nil and v ~= "" end
   if beyond_cpus(job_desc.tres_per_job) or beyond_cpus(job_desc.tres_per_socket)
      or beyond_cpus(job_desc.tres_per_task) then
      return "GPUs are asked for only with delegate's --gpus (no --gpus, --gpus-per-task or --gpus-per-socket)"
   end
   local tpn = job_desc.tres_per_node
   if gpus == 0 then
      if set(tpn) then return "--gres is asked for only with delegate's --gpus" end
      return nil
   end
   if tpn == "gres:gpu:" .. gpus or tpn == "gpu:" .. gpus then return nil end
   return "the job's --gres must be the script's own (gpu:" .. gpus .. ")"
end

-- nil when a job name is plain text, else the reason. A name is shown
-- raw by squeue, sacct and scontrol: '|' forges fields of their parsable
-- output (and newlines whole records of other students, in the
-- instructor's usage report); control characters (C0, DEL, and C1 as
-- UTF-8, e.g. CSI) are terminal escape sequences in everyone's terminal.
local MAX_NAME = 200
local function name_refusal(name)
   if name == nil then return nil end
   if #name > MAX_NAME then return "a job name has at most " .. MAX_NAME .. " bytes" end
   if name:find("[%c|]") or name:find("\194[\128-\159]") then
      return "a job name may not hold '|', newlines or other control characters"
   end
   return nil
end

-- ---- delegate's partitions (the site policy's `partitions`) ----------------
-- On a cluster whose other partitions run plain Slurm jobs, the gate keeps
-- to delegate's partitions: a job that goes only elsewhere is the site's
-- (returned at once, untouched), unless it is one of delegate's own forms
-- (those run only in delegate's partitions); a job may not name delegate's
-- partitions together with others, nor move between them and others.

-- The names in a partition list ("a,b"); {} for none.
local function split_partitions(s)
   local names = {}
   if s ~= nil and s ~= "" then
      for name in string.gmatch(s, "[^,]+") do names[#names + 1] = name end
   end
   return names
end

-- The partitions a job goes to: those it names, else the default one of
-- those Slurm offers the submitter (part_list), which is then also set as
-- the job's partition (what the gate checked is where the job goes).
-- slurmctld (22.05) keeps the default flag on a partition that was the
-- default before `scontrol update PartitionName=... Default=YES|NO` moved
-- it: among several flagged, one that is not delegate's is chosen (a job
-- that names no partition is the site's unless delegate's is the only
-- default). {} when nothing is known.
local function job_partitions(job_desc, part_list)
   local names = split_partitions(job_desc.partition)
   if #names > 0 then return names end
   local chosen
   for _, part in pairs(part_list or {}) do
      local d = part.flag_default
      if (d == 1 or d == true) and part.name ~= nil then
         if chosen == nil or (PARTITIONS ~= nil and PARTITIONS[chosen] and not PARTITIONS[part.name]) then
            chosen = part.name
         end
      end
   end
   if chosen ~= nil then
      if PARTITIONS ~= nil then job_desc.partition = chosen end
      names[1] = chosen
   end
   return names
end

-- "ours" when every partition named is delegate's (or every partition is:
-- no PARTITIONS; or none is known: fail closed), "theirs" when none is,
-- "both" otherwise.
local function scope(names)
   if PARTITIONS == nil or #names == 0 then return "ours" end
   local n = 0
   for _, name in ipairs(names) do
      if PARTITIONS[name] then n = n + 1 end
   end
   if n == 0 then return "theirs" end
   if n == #names then return "ours" end
   return "both"
end

local function partition_list()
   local names = {}
   for name in pairs(PARTITIONS or {}) do names[#names + 1] = name end
   table.sort(names)
   return table.concat(names, ", ")
end

-- For job_submit: "pass" (the site's job: not ours to check),
-- "check" (delegate's partitions: the checks below), or a refusal.
local function partition_verdict(job_desc, part_list)
   if PARTITIONS == nil then return "check" end
   local where = scope(job_partitions(job_desc, part_list))
   if where == "both" then
      return nil, "a job may not name delegate's partitions (" .. partition_list() .. ") together with others"
   end
   if where == "theirs" then
      local s = job_desc.script
      if s ~= nil and s:find(RUNNER, 1, true) then
         return nil, "delegate's jobs run only in its partitions (" .. partition_list() .. ")"
      end
      return "pass"
   end
   return "check"
end

-- nil and the script's number of calls when the job may run, else the
-- reason it may not.
local function refuse_reason(job_desc, submit_uid)
   if job_desc.user_id ~= submit_uid then return "--uid is reserved to administrators" end
   local script = job_desc.script
   if script == nil or script == "" then
      return "interactive allocations (salloc, srun) are disabled for users; submit through delegate"
   end
   if script:find("# This script was created by sbatch --wrap.", 1, true) then
      return "sbatch --wrap is disabled for users; submit through delegate"
   end
   if job_desc.het_job_offset ~= nil and job_desc.het_job_offset ~= NO_VAL then
      return "heterogeneous jobs are not allowed"
   end
   if job_desc.container ~= nil and job_desc.container ~= "" then return "--container is not allowed" end
   if job_desc.argc ~= nil and job_desc.argc > 1 then return "script arguments are not allowed" end
   local nwhy = name_refusal(job_desc.name)
   if nwhy then return nwhy end
   local env = job_desc.environment
   if env == nil then return "a batch job without its environment" end
   -- Set by sbatch for --get-user-env, --export=NONE and any --export but
   -- plain ALL: slurmd (root) would run `su - <user> -c env` on the worker.
   if env.SLURM_GET_USER_ENV ~= nil then
      return "--get-user-env and --export other than ALL are not allowed"
   end
   local why, gpus, nodes, calls, map = check_script(script, job_desc.array_inx)
   if why then return why end
   -- A map's allocation claims calls while it is younger than the site's
   -- max_allocation_time (sandbox-runner pull; the agent refuses later
   -- ones), so it holds its node at most that plus one call's limit: its
   -- Slurm limit is no longer.
   if map then
      local t = job_desc.time_limit
      if t == nil or t == NO_VAL or t == 0 or t > MAX_MAP_MINUTES then
         return "a map's allocation has a time limit of at most "
                .. MAX_MAP_MINUTES .. " minutes on this cluster"
      end
   end
   -- The node count is the script's own: 1, or the multi-node form's N
   -- (sbatch sets min_nodes from the script's "#SBATCH --nodes=N").
   local function over(v)
      if v == nil or v == NO_VAL then return false end
      if nodes == 1 then return v > 1 end
      return v ~= nodes
   end
   if over(job_desc.min_nodes) or over(job_desc.max_nodes) then
      if nodes == 1 then return "delegate jobs use one node" end
      return "the job's node count must be the script's own (" .. nodes .. ")"
   end
   local gwhy = check_gres(job_desc, gpus)
   if gwhy then return gwhy end
   return nil, calls, map, nodes
end

local function job_submit(job_desc, part_list, submit_uid)
   local okp, verdict, pwhy = pcall(partition_verdict, job_desc, part_list)
   if okp and verdict == "pass" then return slurm.SUCCESS end
   local ok, admin = pcall(is_admin, submit_uid, job_desc)
   if ok and admin then return slurm.SUCCESS end
   if not okp or pwhy then
      local why = pwhy or "internal error of the site's job check"
      if not okp then
         slurm.log_error("delegate lockdown: partition check failed (%s); refusing uid %d", tostring(verdict), submit_uid)
      end
      slurm.log_info("delegate lockdown: refused uid %d: %s", submit_uid, why)
      slurm.log_user("%s", "delegate: " .. why)
      return slurm.ESLURM_ACCESS_DENIED
   end
   local ok2, why, calls, map, nodes = pcall(refuse_reason, job_desc, submit_uid)
   if not ok2 then
      slurm.log_error("delegate lockdown: check failed (%s); refusing uid %d", tostring(why), submit_uid)
      slurm.log_user("delegate: job refused (internal error of the site's job check)")
      return slurm.ESLURM_ACCESS_DENIED
   end
   if why then
      slurm.log_info("delegate lockdown: refused uid %d: %s", submit_uid, why)
      slurm.log_user("%s", "delegate: only delegate's own jobs may run here: " .. why)
      return slurm.ESLURM_ACCESS_DENIED
   end
   -- The accounting's count of calls is the script's, not the submitter's.
   -- Whether a job goes back to the queue when its node is lost: a map's
   -- allocations always (they run only the calls they claim, recover their
   -- own lost claims, and requeue themselves to step aside); a one-node
   -- call as delegate submitted it (--requeue for a call with retries: the
   -- runner starts a new attempt from a fresh directory only when the last
   -- one left no outcome, within the call's retries and the site's
   -- max_retries); a multi-node job never (its ranks' files would mix).
   -- Nor does a job send mail (`--mail-user=<anyone> --mail-type=ALL`:
   -- slurmctld's MailProg would write to any address a student names).
   local ok3, err = pcall(function()
      job_desc.comment = CALLS_COMMENT .. calls
      if map then
         job_desc.requeue = 1
      elseif nodes == 1 and job_desc.requeue == 1 then
         job_desc.requeue = 1
      else
         job_desc.requeue = 0
      end
      job_desc.mail_type = 0
      job_desc.mail_user = ""
   end)
   if not ok3 then
      slurm.log_error("delegate lockdown: cannot set the comment (%s); refusing uid %d", tostring(err), submit_uid)
      slurm.log_user("delegate: job refused (internal error of the site's job check)")
      return slurm.ESLURM_ACCESS_DENIED
   end
   return slurm.SUCCESS
end

-- nil when a user's update of their job (`scontrol update job=...`) may
-- go on, else the reason. What a user may still do: hold, release, shorten,
-- nice, move between partitions and nodes Slurm lets them use. What is the
-- script's own and stays so: the node count (slurmctld lets a user grow a
-- pending job's NumNodes: on an exclusive partition that would take whole
-- nodes nobody uses), the generic resources (GPUs), and the comment (the
-- accounting's count of calls), whether the job goes back to the queue
-- when its node is lost (delegate's, from the call's retries: a student
-- who set it could have a call without retries run again), and that it sends
-- no mail; and the time limit only shortens (slurmctld lets a user raise a
-- pending job's limit up to the partition's MaxTime: a held job raised to
-- hours held its node past max_time and max_allocation_time while others
-- waited, security round 4, item 2).
local function modify_refusal(job_desc, job_ptr)
   local function set(v) return v ~= nil and v ~= "" and v ~= NO_VAL end
   if set(job_desc.time_limit) then
      local now = job_ptr and job_ptr.time_limit
      if now == nil or now == NO_VAL or job_desc.time_limit > now then
         return "a job's time limit may only be shortened; submit it again through delegate with --time"
      end
   end
   if job_desc.requeue ~= nil and job_desc.requeue ~= NO_VAL16 then
      return "whether a job may run again is delegate's (from the call's retries); only administrators change it"
   end
   if (job_desc.mail_type ~= nil and job_desc.mail_type ~= NO_VAL16 and job_desc.mail_type ~= 0)
      or set(job_desc.mail_user) then
      return "delegate's jobs send no mail; only administrators change it"
   end
   if set(job_desc.comment) or job_desc.comment == "" then
      return "a job's comment is delegate's record of its calls; only administrators change it"
   end
   local nwhy = name_refusal(job_desc.name)
   if nwhy then return nwhy end
   if set(job_desc.min_nodes) or set(job_desc.max_nodes) then
      return "a job's node count is its script's own; submit it again through delegate with --nodes"
   end
   if set(job_desc.tres_per_node) or set(job_desc.tres_per_job) or set(job_desc.tres_per_socket)
      or set(job_desc.tres_per_task) then
      return "a job's GPUs are its script's own; submit it again through delegate with --gpus"
   end
   return nil
end

local function job_modify(job_desc, job_ptr, part_list, modify_uid)
   -- Nothing a user may update changes what runs: the script and
   -- environment are fixed at submission, and --uid changes are root's
   -- alone in slurmctld itself. Fail closed, as slurm_job_submit.
   local ok, why = pcall(function()
      if uid_is_admin(modify_uid) then return nil end
      if PARTITIONS ~= nil then
         local now = scope(split_partitions(job_ptr.partition))
         local wanted = split_partitions(job_desc.partition)
         if #wanted > 0 and scope(wanted) ~= now then
            return "a job cannot move between delegate's partitions (" .. partition_list() .. ") and others"
         end
         -- The site's job: the site's rules, not delegate's.
         if now == "theirs" then return nil end
      end
      return modify_refusal(job_desc, job_ptr)
   end)
   -- (22.05 discards log_user messages of job_modify: the user sees
   -- "Access/permission denied"; the reason is in slurmctld's log.)
   if not ok then
      slurm.log_error("delegate lockdown: modify check failed (%s); refusing uid %d", tostring(why), modify_uid)
      return slurm.ESLURM_ACCESS_DENIED
   end
   if why then
      slurm.log_info("delegate lockdown: refused an update by uid %d: %s", modify_uid, why)
      return slurm.ESLURM_ACCESS_DENIED
   end
   return slurm.SUCCESS
end

-- The gate: its two checks, and its parts for tests/lua/job_submit_test.lua.
local gate = { job_submit = job_submit, job_modify = job_modify,
               internals = { check_script = check_script, refuse_reason = refuse_reason,
                       batch_script = batch_script, array_script = array_script,
                       pull_script = pull_script, safe_path = safe_path,
                       with_gpus = with_gpus, check_gres = check_gres,
                       name_refusal = name_refusal, modify_refusal = modify_refusal,
                       scope = scope, job_partitions = job_partitions,
                       ranks_script = ranks_script, uid_is_admin = uid_is_admin,
                       set_account_files = function(g, p)
                          GROUP_FILE, PASSWD_FILE, cache = g, p, { t = -1 }
                       end } }

slurm.log_info("delegate lockdown: job_submit gate loaded (runner %s)", RUNNER)
-- As a module of the site's own job_submit.lua (AS_MODULE, `delegate-deploy
-- gate --module`): the site's script does
--   local delegate = dofile("/etc/slurm/delegate_gate.lua")
-- and calls delegate.job_submit / delegate.job_modify from its own
-- slurm_job_submit / slurm_job_modify (docs/existing-site.md); nothing
-- global is defined here then.
if AS_MODULE then return gate end
-- As slurmctld's whole job_submit.lua (a cluster delegate owns).
slurm_job_submit, slurm_job_modify = gate.job_submit, gate.job_modify
_delegate_lockdown = gate.internals
return slurm.SUCCESS
