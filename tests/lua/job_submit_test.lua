-- Unit tests of slurm-conf/job_submit.lua (delegate's slurmctld gate), with a
-- stub `slurm` table. Run: lua5.1 tests/lua/job_submit_test.lua [job_submit.lua]
-- (tests/run.sh runs it on lua5.1 and lua5.4; tests/e2e/test_lockdown.py on the installed gate).
-- The site's settings are put above the body here as `delegate-deploy gate` would.
-- It runs on Lua 5.1 to 5.4 (the Lua of each Slurm release's job_submit_lua.so).
loadstring = loadstring or load
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2002,
  log_info = function(fmt, ...) last_info_msg = string.format(fmt, ...) end, log_error = function(...) end,
  log_user = function(fmt, ...) last_user_msg = string.format(fmt, ...) end }
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local path = arg[1] or (here .. "/../../slurm-conf/job_submit.lua")
local f = assert(io.open(path, "r"))
local text = f:read("*a"); f:close()
-- The site's settings as `delegate-deploy gate` renders them above the body
-- (slurm-conf/job_submit.settings.lua.j2); a rendered file (arg[1] from an
-- installed gate, first line a comment) is used as it is.
if not text:match("^%-%-%[%[") then
  text = text:gsub("^#[^\n]*", "")  -- luaL_loadfile skips a first line starting with '#'
else
  text = 'local RUNNER = "/usr/local/bin/sandbox-runner"\n'
    .. 'local JOB_ROOTS = { "/home" }\n'
    .. 'local ADMIN_GROUP = "delegate-admin"\n'
    .. 'local ADMIN_UIDS = { [0] = true, [64030] = true }\n'
    .. 'local MAX_MAP_MINUTES = 17\n'
    .. 'local PARTITIONS = nil\n'
    .. 'local AS_MODULE = false\n' .. text
end
-- The gate with other settings (as the renderer would write them).
local function with_setting(name, value)
  local out, n = text:gsub("\nlocal " .. name .. "%s*=[^\n]*", "\nlocal " .. name .. " = " .. value, 1)
  assert(n == 1, "the gate has no " .. name .. " setting")
  return out
end
-- The bound of a map's allocation the tests below assume (an installed
-- gate's is its site's): 10m + 5m + 30 s, plus the client's minute.
text = with_setting("MAX_MAP_MINUTES", "17")
assert(loadstring(text, "=job_submit.lua"))()
local L = _delegate_lockdown
local D1 = "/home/alice/.delegate/jobs/20261123T103000-abcdef01"
local D2 = "/home/alice/.delegate/jobs/20261123T103001-abcdef02"
local R = "/usr/local/bin/sandbox-runner"
local function job(script, extra)
  local j = { user_id = 1001, group_id = 1001, user_name = "alice", script = script,
              argc = 1, min_nodes = 1, max_nodes = NOVAL, time_limit = 5, environment = { PATH = "/bin" },
              het_job_offset = 4294967294 }
  for k, v in pairs(extra or {}) do j[k] = v end
  return j
end
local function replace(s, old, new)
  local i, j = s:find(old, 1, true); assert(i, "replace: not found")
  return s:sub(1, i - 1) .. new .. s:sub(j + 1)
end
local n, fails = 0, 0
local function expect(name, want_ok, j)
  n = n + 1
  last_user_msg = nil
  local rc = slurm_job_submit(j, {}, 1001)
  local ok = (rc == 0)
  if ok ~= want_ok then fails = fails + 1; print("FAIL " .. name .. " rc=" .. rc .. " " .. tostring(last_user_msg))
  else print("ok   " .. name .. (ok and "" or ("  -> " .. tostring(last_user_msg)))) end
end
-- The forms the client writes: tests/fixtures/batch-scripts/, checked
-- against broker/client/src/slurm/script.rs by its unit test (one source:
-- a form changed there fails here until the gate accepts it).
local function fixture(name)
  local fx = assert(io.open(here .. "/../fixtures/batch-scripts/" .. name, "r"))
  local body = fx:read("*a"); fx:close()
  return body
end
local single, arr = fixture("single.sh"), fixture("array.sh")
local sh1, sh2 = fixture("map.sh"), fixture("map-array.sh")
-- the gate writes each form exactly as the client does
assert(L.batch_script(R, D1) == single and L.array_script(R, {D1, D2}, {D1..".log", D2..".log"}) == arr)
assert(L.pull_script(R, {D1, D2}, 1) == sh1 and L.pull_script(R, {D1, D2}, 2) == sh2)

expect("single form", true, job(single))
expect("array form", true, job(arr, { array_inx = "0-1" }))
expect("map form", true, job(sh1))
expect("map array form", true, job(sh2, { array_inx = "0-1" }))
expect("map array, --array not the script's", false, job(sh2, { array_inx = "0-5" }))
expect("map with more allocations than calls", false,
  job(replace(sh2, "--array=0-1", "--array=0-2"), { array_inx = "0-2" }))
-- the planned batch of old (sandbox-runner batch) is no form any more
expect("old batch form", false, job("#!/bin/sh\nexec '" .. R .. "' batch '" .. D1 .. "' '" .. D2 .. "'\n"))
-- a map's allocation: max_allocation_time (10m) + max_time (5m) + 30 s,
-- plus the client's minute
expect("map form at the bound", true, job(sh1, { time_limit = 17 }))
expect("map form over the bound", false, job(sh1, { time_limit = 18 }))
expect("map form without a time limit", false, job(sh1, { time_limit = 4294967294 }))
expect("array of one call each: no bound", true, job(arr, { array_inx = "0-1", time_limit = 600 }))
expect("a single call keeps its own limit", true, job(single, { time_limit = 600 }))
-- GPUs: the script's own "#SBATCH --gres=gpu:N" line (script.rs: with_gpus),
-- and the job's request (tres_per_node) must be exactly that line's.
local g1 = fixture("gpu-single.sh")
assert(L.with_gpus(single, 1) == g1 and L.with_gpus(single, 0) == single)
local g2arr = fixture("gpu-array.sh")
assert(L.with_gpus(arr, 2) == g2arr)
expect("gpu single form", true, job(g1, { tres_per_node = "gres:gpu:1" }))
expect("gpu array form", true, job(g2arr, { array_inx = "0-1", tres_per_node = "gres:gpu:2" }))
expect("gpu map form", true, job(L.with_gpus(sh1, 1), { tres_per_node = "gres:gpu:1" }))
expect("gpu line, command line asks more", false, job(g1, { tres_per_node = "gres:gpu:2" }))
expect("gpu line, request dropped", false, job(g1))
expect("no gpu line, --gres on the command line", false, job(single, { tres_per_node = "gres:gpu:1" }))
expect("--gpus (per job)", false, job(single, { tres_per_job = "gres:gpu:1" }))
expect("--gpus-per-task", false, job(g1, { tres_per_node = "gres:gpu:1", tres_per_task = "gres:gpu:1" }))
-- Slurm 23.02+ (Debian 13's 24.11) puts --cpus-per-task into tres_per_task.
expect("24.11: --cpus-per-task as tres_per_task cpu=2", true, job(single, { tres_per_task = "cpu=2" }))
expect("24.11: a GPU beside the CPUs in tres_per_task", false, job(single, { tres_per_task = "cpu=2,gres/gpu=1" }))
expect("24.11: a GPU per task in its own format", false, job(single, { tres_per_task = "gres/gpu:1" }))
expect("24.11: cpu with trailing text", false, job(single, { tres_per_task = "cpu=2x" }))
expect("gpu line with leading zero", false, job((g1:gsub("gpu:1", "gpu:01")), { tres_per_node = "gres:gpu:1" }))
expect("gpu line zero", false, job((g1:gsub("gpu:1", "gpu:0"))))
expect("gpu line huge", false, job((g1:gsub("gpu:1", "gpu:99999")), { tres_per_node = "gres:gpu:99999" }))
expect("gpu line typed", false, job((g1:gsub("gpu:1", "gpu:a100:1")), { tres_per_node = "gres:gpu:a100:1" }))
expect("gpu line twice", false, job(L.with_gpus(g1, 1), { tres_per_node = "gres:gpu:1" }))
expect("gpu line after exec", false, job(single .. "#SBATCH --gres=gpu:1\n", { tres_per_node = "gres:gpu:1" }))
expect("salloc/srun allocation (script nil)", false, job(nil))
expect("sbatch --wrap", false, job("#!/bin/sh\n# This script was created by sbatch --wrap.\n\npython3 -c 1\n"))
expect("extra command after exec", false, job(single .. "curl evil\n"))
expect("command substitution in path", false, job("#!/bin/sh\nexec '" .. R .. "' '/home/alice/$(id)/20261123T103000-abcdef01'\n"))
expect("unquoted path", false, job("#!/bin/sh\nexec '" .. R .. "' " .. D1 .. "\n"))
expect("quote break-out", false, job("#!/bin/sh\nexec '" .. R .. "' '" .. D1 .. "';id;'\n"))
expect("two runner args", false, job("#!/bin/sh\nexec '" .. R .. "' '" .. D1 .. "' '" .. D2 .. "'\n"))
expect("other binary", false, job("#!/bin/sh\nexec '/bin/bash' '" .. D1 .. "'\n"))
expect("runner probe", false, job("#!/bin/sh\nexec '" .. R .. "' 'probe'\n"))
expect("path outside job roots", false, job("#!/bin/sh\nexec '" .. R .. "' '/tmp/20261123T103000-abcdef01'\n"))
expect("dotdot path", false, job("#!/bin/sh\nexec '" .. R .. "' '/home/../tmp/20261123T103000-abcdef01'\n"))
expect("newline in path", false, job("#!/bin/sh\nexec '" .. R .. "' '/home/a\nid\n/20261123T103000-abcdef01'\n"))
expect("CRLF", false, job((single:gsub("\n", "\r\n"))))
expect("no trailing newline", false, job(single:sub(1, -2)))
expect("different shebang", false, job((single:gsub("^#!/bin/sh", "#!/bin/bash"))))
expect("array: extra task line", false, job(replace(replace(arr, "1) exec", "1) id ;;\n2) exec"), "--array=0-1", "--array=0-2"), { array_inx = "0-2" }))
expect("array: --array mismatch", false, job(arr, { array_inx = "0-99999" }))
expect("array: log elsewhere", false, job(replace(arr, D1 .. ".log", "/home/bob/.delegate/jobs/20261123T103000-abcdef01.log"), { array_inx = "0-1" }))
expect("single with --array", false, job(single, { array_inx = "0-3" }))
expect("--get-user-env / --export=NONE", false, job(single, { environment = { SLURM_GET_USER_ENV = "1" } }))
expect("--container", false, job(single, { container = "/home/alice/bundle" }))
expect("script args", false, job(single, { argc = 2 }))
expect("two nodes", false, job(single, { min_nodes = 2 }))
expect("--uid other user", false, job(single, { user_id = 1002 }))
-- the multi-node form (script.rs: ranks_script): its own node count only
local rk = fixture("ranks.sh")
assert(L.ranks_script(R, D1, 2) == rk)
expect("ranks form, 2 nodes", true, job(rk, { min_nodes = 2, max_nodes = 2 }))
expect("ranks form, max_nodes unset", true, job(rk, { min_nodes = 2 }))
expect("ranks form, more nodes than the script's", false, job(rk, { min_nodes = 3 }))
expect("ranks form, max_nodes above the script's", false, job(rk, { min_nodes = 2, max_nodes = 4 }))
expect("ranks form with 1 node", false, job((rk:gsub("nodes=2", "nodes=1")), { min_nodes = 1 }))
expect("ranks form with 0 nodes", false, job((rk:gsub("nodes=2", "nodes=0")), { min_nodes = 1 }))
expect("ranks form past 256 nodes", false, job((rk:gsub("nodes=2", "nodes=257")), { min_nodes = 257 }))
expect("ranks form, other runner", false, job(replace(rk, R, "/home/alice/runner"), { min_nodes = 2 }))
expect("ranks form, rank instead of ranks", false, job(replace(rk, " ranks ", " rank "), { min_nodes = 2 }))
expect("ranks form, extra word", false, job(replace(rk, "' ranks '", "' ranks '/x' '"), { min_nodes = 2 }))
expect("ranks form, srun line instead", false,
  job("#!/bin/sh\n#SBATCH --nodes=2\nsrun '" .. R .. "' rank '" .. D1 .. "'\n", { min_nodes = 2 }))
expect("ranks form, extra line", false, job(rk .. "id\n", { min_nodes = 2 }))
expect("ranks form, dir outside the roots", false,
  job(replace(rk, D1, "/tmp/20261123T103000-abcdef01"), { min_nodes = 2 }))
expect("ranks form with --array", false, job(rk, { min_nodes = 2, array_inx = "0-1" }))
expect("ranks form with --gres", false, job(rk, { min_nodes = 2, tres_per_node = "gres:gpu:1" }))
expect("single form, max_nodes 2", false, job(single, { max_nodes = 2 }))
expect("het job component", false, job(single, { het_job_offset = 1 }))
expect("huge script", false, job("#!/bin/sh\nexec '" .. R .. "' '" .. string.rep("/a", 600000) .. "'\n"))
-- what the client would generate for a root with a quote in it (shell_quote's '\'')
expect("quote in the root, as shell_quote writes it", false,
  job("#!/bin/sh\nexec '" .. R .. "' '/home/o'\\''k/20261123T103000-abcdef01'\n"))
expect("wrap with a forged delegate line", false,
  job("#!/bin/sh\n# This script was created by sbatch --wrap.\n\nexec '" .. R .. "' '" .. D1 .. "'\n"))
expect("--export=ALL (no SLURM_GET_USER_ENV) passes", true, job(single, { environment = { PATH = "/bin", LD_PRELOAD = "/x.so" } }))
expect("array spec given twice differently", false, job(sh2, { array_inx = "0-1%1" }))
-- admins: from /etc/group members or /etc/passwd primary gid, never the job's group_id
local dir = os.tmpname(); os.remove(dir); os.execute("mkdir -p " .. dir)
local function write(name, text) local h = assert(io.open(dir .. "/" .. name, "w")); h:write(text); h:close() end
write("group", "root:x:0:\ndelegate-admin:x:990:carol,dave\nalice:x:1001:\nerin:x:991:\n")
write("passwd", "root:x:0:0::/root:/bin/sh\nalice:x:1001:1001::/home/alice:/bin/sh\n" ..
  "carol:x:1003:1003::/home/carol:/bin/sh\nfrank:x:1005:990::/home/frank:/bin/sh\n")
L.set_account_files(dir .. "/group", dir .. "/passwd")
local function as(name, uid, extra)
  local j = job(nil, { user_id = uid, user_name = name }); for k, v in pairs(extra or {}) do j[k] = v end
  last_user_msg = nil; return slurm_job_submit(j, {}, uid)
end
local function check(name, cond) n = n + 1; if cond then print("ok   " .. name) else fails = fails + 1; print("FAIL " .. name) end end
check("admin group member may salloc", as("carol", 1003) == 0)
check("primary group admin may salloc", as("frank", 1005) == 0)
check("a student claiming the admin gid as group_id is refused", as("alice", 1001, { group_id = 990 }) ~= 0)
check("SlurmUser may salloc", as("slurm", 64030) == 0)
check("a student may not salloc", as("alice", 1001) ~= 0)
-- the comment: the accounting's count of calls, from the script, never the submitter's
local function comment_of(script, extra)
  local j = job(script, extra); local rc = slurm_job_submit(j, {}, 1001); return rc, j.comment
end
local rc1, c1 = comment_of(single, { comment = "delegate:calls=999999" })
check("a forged calls comment is replaced by the script's (1)", rc1 == 0 and c1 == "delegate:calls=1")
local rc2, c2 = comment_of(arr, { array_inx = "0-1" })
check("an array's comment counts its elements", rc2 == 0 and c2 == "delegate:calls=2")
local _, c3 = comment_of(sh1, { comment = "x" })
check("a map's allocation's comment counts its calls", c3 == "delegate:calls=2")
local _, c4 = comment_of(sh2, { array_inx = "0-1" })
check("a map's allocations' comment counts its calls", c4 == "delegate:calls=2")
local _, c5 = comment_of(rk, { min_nodes = 2, comment = "delegate:calls=50" })
check("a multi-node job is one call", c5 == "delegate:calls=1")
do
  local j = job(single, { requeue = 1 }); local rc = slurm_job_submit(j, {}, 1001)
  check("a call with retries is requeueable (a new attempt when its node is lost)", rc == 0 and j.requeue == 1)
  local n = job(single, { requeue = 0 }); rc = slurm_job_submit(n, {}, 1001)
  check("a call without retries is not", rc == 0 and n.requeue == 0)
  local u = job(single, {}); rc = slurm_job_submit(u, {}, 1001)
  check("nor one that did not say (Slurm's default is not delegate's)", rc == 0 and u.requeue == 0)
  local a = job(arr, { array_inx = "0-1", requeue = 1 }); rc = slurm_job_submit(a, {}, 1001)
  check("an array of one call each as asked", rc == 0 and a.requeue == 1)
  local r = job(rk, { min_nodes = 2, requeue = 1 }); rc = slurm_job_submit(r, {}, 1001)
  check("a multi-node job never, even asked for (its ranks' files would mix)", rc == 0 and r.requeue == 0)
  local m = job(sh2, { array_inx = "0-1", requeue = 0 }); rc = slurm_job_submit(m, {}, 1001)
  check("a map's allocations are (they requeue themselves to step aside)", rc == 0 and m.requeue == 1)
  local m = job(single, { mail_type = 0x7f, mail_user = "victim@example.org" })
  rc = slurm_job_submit(m, {}, 1001)
  check("a student's job sends no mail", rc == 0 and m.mail_type == 0 and m.mail_user == "")
end
local function modify(uid, fields)
  last_info_msg = nil; return slurm_job_modify(fields, { job_id = 1, time_limit = 10 }, {}, uid)
end
-- security round 4, item 2: a student raised a held job's limit to hours
check("a student may not raise a job's time limit", modify(1001, { time_limit = 120 }) ~= 0
  and last_info_msg:find("only be shortened", 1, true) ~= nil)
check("nor make it unlimited", modify(1001, { time_limit = 4294967295 }) ~= 0)
check("the same limit is no raise", modify(1001, { time_limit = 10 }) == 0)
check("an administrator may raise it", modify(0, { time_limit = 120 }) == 0)
last_info_msg = nil
check("a job whose limit Slurm does not show may not be given one",
  slurm_job_modify({ time_limit = 5 }, { job_id = 1 }, {}, 1001) ~= 0)
check("a student may not change a job's comment", modify(1001, { comment = "delegate:calls=9" }) ~= 0
  and last_info_msg:find("only administrators", 1, true) ~= nil)
check("a student may still hold, release, shorten", modify(1001, { time_limit = 5, priority = 0 }) == 0)
check("an empty comment is a change too", modify(1001, { comment = "" }) ~= 0)
check("a student may not grow a job's node count", modify(1001, { min_nodes = 4 }) ~= 0
  and last_info_msg:find("node count", 1, true) ~= nil)
check("nor its maximum", modify(1001, { max_nodes = 4 }) ~= 0)
check("NO_VAL node counts are no change", modify(1001, { min_nodes = 4294967294, max_nodes = 4294967294 }) == 0)
-- job names: shown raw by squeue/sacct/scontrol (security round 3, item 4)
local forged = "x|COMPLETED|0|1|vm|delegate:calls=77777\n99999|bob|y|FAILED|86400|1|vm|delegate:calls=5000"
for label, name in pairs({ ["'|'"] = "a|b", newline = "a\nb", forged = forged, escape = "a\27[31mred",
                           DEL = "a\127", ["C1 CSI as UTF-8"] = "a\194\155" .. "31m", long = string.rep("n", 201) }) do
  expect("a job name with " .. label .. " is refused", false, job(single, { name = name }))
  check("and may not be set later (" .. label .. ")", modify(1001, { name = name }) ~= 0)
end
expect("a plain job name", true, job(single, { name = "20261123T103000-abcdef01-shared" }))
expect("a UTF-8 job name", true, job(single, { name = "m\195\169trique" }))
check("a plain name may be set later", modify(1001, { name = "mon-essai" }) == 0)
for _, f in ipairs({ "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }) do
  check("a student may not change " .. f, modify(1001, { [f] = "gres:gpu:2" }) ~= 0
    and last_info_msg:find("GPUs", 1, true) ~= nil)
end
check("a student may not make a job requeueable", modify(1001, { requeue = 1 }) ~= 0
  and last_info_msg:find("run again", 1, true) ~= nil)
check("nor set it to no again", modify(1001, { requeue = 0 }) ~= 0)
check("a student may not add mail to a job", modify(1001, { mail_type = 1, mail_user = "x@example.org" }) ~= 0
  and last_info_msg:find("no mail", 1, true) ~= nil)
check("nor a mail address alone", modify(1001, { mail_user = "x@example.org" }) ~= 0)
check("NO_VAL16 mail type is no change", modify(1001, { mail_type = 65534, time_limit = 5 }) == 0)
check("NO_VAL16 requeue is no change", modify(1001, { requeue = 65534, time_limit = 5 }) == 0)
check("an admin may make a job requeueable (the elastic power program)", modify(0, { requeue = 1 }) == 0)
check("an admin may change the node count", modify(1003, { min_nodes = 2 }) == 0)
check("an admin group member may change a comment", modify(1003, { comment = "c" }) == 0)
check("root may change a comment", modify(0, { comment = "c" }) == 0)
check("a uid not in passwd may not change a comment", modify(4242, { comment = "c" }) ~= 0)
local badmod = setmetatable({}, { __index = function(t, k) error("boom " .. k) end })
check("a modify check that throws refuses", modify(1001, badmod) ~= 0)
L.set_account_files(dir .. "/missing", dir .. "/missing")
check("no admin group: only root and SlurmUser", as("carol", 1003) ~= 0 and as("root", 0) == 0)
os.execute("rm -rf " .. dir)
-- admin / root
local rc = slurm_job_submit(job(nil, { user_id = 0 }), {}, 0); n = n + 1
if rc ~= 0 then fails = fails + 1; print("FAIL root salloc") else print("ok   root may salloc") end
-- fail-closed: a field access that throws
local bad = setmetatable({ user_id = 1001 }, { __index = function(t, k) error("boom " .. k) end })
rc = slurm_job_submit(bad, {}, 1001); n = n + 1
if rc == 0 then fails = fails + 1; print("FAIL error accepted") else print("ok   runtime error refuses (fail-closed)") end
-- A cluster shared with plain Slurm jobs: the site policy's partitions
-- (PARTITIONS) are delegate's, "general" is the site's.
do
  local scoped = with_setting("PARTITIONS", '{ ["course"] = true }')
  assert(loadstring(scoped, "=job_submit.lua (scoped)"))()
  _delegate_lockdown.set_account_files(dir .. "/missing", dir .. "/missing")
  local S = _delegate_lockdown
  local parts = { { name = "general", flag_default = 1 }, { name = "course", flag_default = 0 } }
  local function submit(j, plist) last_user_msg = nil; return slurm_job_submit(j, plist or parts, 1001) end
  local wrap = "#!/bin/sh\n# This script was created by sbatch --wrap.\nhostname\n"
  check("scope: course is ours, general theirs, both mixed",
    S.scope({ "course" }) == "ours" and S.scope({ "general" }) == "theirs" and S.scope({ "course", "general" }) == "both")
  check("scope: an unknown partition counts as ours (fail closed)", S.scope({}) == "ours")
  check("the default partition comes from part_list", S.job_partitions(job(single), parts)[1] == "general")
  local stale = { { name = "course", flag_default = 1 }, { name = "general", flag_default = 1 } }
  local j = job(wrap)
  check("of two flagged default (a stale flag), the site's is chosen and set",
    S.job_partitions(j, stale)[1] == "general" and j.partition == "general")
  local only = { { name = "course", flag_default = 1 }, { name = "general", flag_default = 0 } }
  check("delegate's partition as the only default: a job naming none is delegate's",
    submit(job(wrap), only) ~= 0)
  local researcher = job(wrap, { partition = "general" })
  check("a researcher's sbatch --wrap in general passes untouched",
    submit(researcher) == 0 and researcher.comment == nil and researcher.requeue == nil)
  check("so does an interactive allocation in general (salloc)", submit(job(nil, { partition = "general" })) == 0)
  check("and one in the default partition (general)", submit(job(nil)) == 0)
  check("but not in course", submit(job(nil, { partition = "course" })) ~= 0
    and last_user_msg:find("interactive allocations", 1, true) ~= nil)
  check("sbatch --wrap in course is refused", submit(job(wrap, { partition = "course" })) ~= 0)
  local ours = job(single, { partition = "course" })
  check("delegate's job in course passes its checks", submit(ours) == 0 and ours.comment == "delegate:calls=1")
  check("delegate's job in general is refused", submit(job(single, { partition = "general" })) ~= 0
    and last_user_msg:find("run only in its partitions (course)", 1, true) ~= nil)
  check("naming course and general together is refused", submit(job(wrap, { partition = "course,general" })) ~= 0
    and last_user_msg:find("together with others", 1, true) ~= nil)
  check("root may do anything anywhere", slurm_job_submit(job(nil, { user_id = 0, partition = "course" }), parts, 0) == 0)
  local function move(uid, from, to, extra)
    local fields = { partition = to }
    for k, v in pairs(extra or {}) do fields[k] = v end
    last_info_msg = nil
    return slurm_job_modify(fields, { job_id = 1, partition = from }, parts, uid)
  end
  check("a delegate job may not move to general", move(1001, "course", "general") ~= 0
    and last_info_msg:find("cannot move between", 1, true) ~= nil)
  check("a researcher's job may not move into course", move(1001, "general", "course") ~= 0)
  check("nor into course and general", move(1001, "general", "general,course") ~= 0)
  check("a researcher's job may change anything else", move(1001, "general", nil, { comment = "mine", min_nodes = 4 }) == 0)
  check("a delegate job's comment stays delegate's", move(1001, "course", nil, { comment = "x" }) ~= 0)
  check("root may move any job", move(0, "course", "general") == 0)
end
-- The gate as a module of a site's own job_submit.lua (delegate-deploy gate
-- --module; slurm-conf/site_job_submit.example.lua, the lines
-- docs/existing-site.md gives): it defines no global, the site's rules keep
-- their place, delegate's partitions stay delegate's.
do
  local module = with_setting("PARTITIONS", '{ ["course"] = true }')
  module = module:gsub("\nlocal AS_MODULE%s*=[^\n]*", "\nlocal AS_MODULE = true", 1)
  slurm_job_submit, slurm_job_modify, _delegate_lockdown = nil, nil, nil
  local gate = assert(loadstring(module, "=delegate_gate.lua"))()
  check("as a module the gate returns its checks and defines no global",
    type(gate) == "table" and type(gate.job_submit) == "function" and type(gate.job_modify) == "function"
    and slurm_job_submit == nil and slurm_job_modify == nil and _delegate_lockdown == nil)
  gate.internals.set_account_files(dir .. "/missing", dir .. "/missing")
  local site_path = here .. "/../../slurm-conf/site_job_submit.example.lua"
  local sf = assert(io.open(site_path, "r"))
  local site = sf:read("*a"); sf:close()
  -- The example with `dofile` giving `loaded` (a value, or an error when
  -- it is a string starting "error:") and the site's rule line replaced.
  local function load_site(loaded, rule)
    local text = site
    if rule then text = text:gsub("      job_desc.time_limit = 60\n", rule .. "\n", 1) end
    local real_dofile = dofile
    dofile = function(p)
      assert(p == "/etc/slurm/delegate_gate.lua", "the example loads " .. p)
      if type(loaded) == "string" and loaded:match("^error:") then error(loaded) end
      return loaded
    end
    slurm_job_submit, slurm_job_modify = nil, nil
    assert(loadstring(text, "=site job_submit.lua"))()
    dofile = real_dofile
  end
  load_site(gate)
  local parts = { { name = "general", flag_default = 1 }, { name = "course", flag_default = 0 } }
  local function submit(j) last_user_msg = nil; return slurm_job_submit(j, parts, 1001) end
  local wrap = "#!/bin/sh\n# This script was created by sbatch --wrap.\nhostname\n"
  local researcher = job(wrap, { partition = "general", time_limit = 4294967294 })
  check("site + delegate: a researcher's job in general passes, with the site's own rule applied",
    submit(researcher) == 0 and researcher.time_limit == 60 and researcher.comment == nil)
  check("site + delegate: a plain job in course is refused by delegate's check",
    submit(job(wrap, { partition = "course" })) ~= 0 and last_user_msg ~= nil)
  local ours = job(single, { partition = "course" })
  check("site + delegate: delegate's job in course passes", submit(ours) == 0 and ours.comment == "delegate:calls=1")
  check("site + delegate: a researcher's job may not move into course",
    slurm_job_modify({ partition = "course" }, { job_id = 1, partition = "general" }, parts, 1001) ~= 0)
  -- Fail closed where Slurm would accept: a gate that did not load, a site
  -- rule that raises or returns no number.
  for _, case in ipairs({ { "the whole gate (a number), not the module", 0 },
                          { "a missing or unreadable gate file", "error: cannot open /etc/slurm/delegate_gate.lua" },
                          { "an empty gate file", nil } }) do
    load_site(case[2])
    check("site + delegate: " .. case[1] .. " refuses every job, the researcher's too",
      submit(job(wrap, { partition = "general" })) ~= 0 and last_user_msg:find("not loaded", 1, true) ~= nil
      and slurm_job_modify({ partition = "general" }, { job_id = 1, partition = "general" }, parts, 1001) ~= 0)
  end
  load_site(gate, '      error("a bug in the site\'s rule")')
  check("site + delegate: a site rule that raises refuses the job",
    submit(job(wrap, { partition = "general", time_limit = 4294967294 })) ~= 0)
  load_site(gate, "      return nil")
  check("site + delegate: a site rule that returns no number refuses the job",
    submit(job(wrap, { partition = "general", time_limit = 4294967294 })) ~= 0)
  load_site(gate, "      return slurm.ERROR")
  check("site + delegate: the site's own refusal stands",
    submit(job(single, { partition = "course", time_limit = 4294967294 })) == slurm.ERROR)
end
print(string.format("%d tests, %d failures", n, fails))
os.exit(fails == 0 and 0 or 1)
