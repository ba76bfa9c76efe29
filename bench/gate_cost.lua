-- bench/gate_cost.lua -- what delegate's job gate costs a submission on a
-- cluster shared with plain Slurm jobs (issue 33): slurm_job_submit for a
-- researcher's job in another partition (it should be an early return),
-- for delegate's own job in its partition (every check), and a baseline
-- hook that only returns, timed alternately in rounds of one run.
--
--   lua5.1 bench/gate_cost.lua [ROUNDS] [CALLS]      (default 5 rounds of 20000)
--
-- The gate is slurm-conf/job_submit.lua with the settings a deployment
-- renders (PARTITIONS = course) above it and a stub `slurm` table, as in
-- tests/lua/job_submit_test.lua. Prints each round's µs per call and the
-- ratios to the baseline; nothing asserts on time.
local rounds = tonumber(arg[1]) or 5
local calls = tonumber(arg[2]) or 20000
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2002,
  log_info = function() end, log_error = function() end, log_user = function() end }
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local f = assert(io.open(here .. "/../slurm-conf/job_submit.lua", "r"))
local body = f:read("*a"); f:close()
local header = 'local RUNNER = "/usr/local/bin/sandbox-runner"\n'
  .. 'local JOB_ROOTS = { "/home" }\nlocal ADMIN_GROUP = "delegate-admin"\n'
  .. 'local ADMIN_UIDS = { [0] = true, [64030] = true }\nlocal MAX_SHARED_MINUTES = 11\n'
  .. 'local PARTITIONS = { ["course"] = true }\n'
assert(loadstring(header .. body, "=job_submit.lua"))()

local R, D = "/usr/local/bin/sandbox-runner", "/home/alice/.delegate/jobs/20261123T103000-abcdef01"
local parts = { { name = "general", flag_default = 1 }, { name = "course", flag_default = 0 } }
local research = string.rep("#SBATCH --comment=x\n", 40) .. "srun ./simulate --steps 1000000\n"
local function researcher()
  return { user_id = 1001, user_name = "alice", partition = "general", script = "#!/bin/sh\n" .. research,
           argc = 1, min_nodes = 1, environment = { PATH = "/bin" } }
end
local function student()
  return { user_id = 1001, user_name = "alice", partition = "course",
           script = "#!/bin/sh\nexec '" .. R .. "' '" .. D .. "'\n", argc = 1, min_nodes = 1,
           max_nodes = 4294967294, time_limit = 5, environment = { PATH = "/bin" }, het_job_offset = 4294967294 }
end
assert(slurm_job_submit(researcher(), parts, 1001) == 0, "the researcher's job is refused")
assert(slurm_job_submit(student(), parts, 1001) == 0, "delegate's job is refused")
local function baseline(job_desc, part_list, uid) return 0 end

local function time(hook, make)
  local jobs = {}
  for i = 1, calls do jobs[i] = make() end
  local t0 = os.clock()
  for i = 1, calls do hook(jobs[i], parts, 1001) end
  return (os.clock() - t0) / calls * 1e6
end

local sums = { base = 0, research = 0, delegate = 0 }
print(string.format("%-6s %12s %12s %12s   (µs per call, %d calls)", "round", "baseline", "researcher", "delegate", calls))
for r = 1, rounds do
  local b = time(baseline, researcher)
  local x = time(slurm_job_submit, researcher)
  local d = time(slurm_job_submit, student)
  sums.base, sums.research, sums.delegate = sums.base + b, sums.research + x, sums.delegate + d
  print(string.format("%-6d %12.3f %12.3f %12.3f", r, b, x, d))
end
local b = sums.base / rounds
print(string.format("mean   %12.3f %12.3f %12.3f", b, sums.research / rounds, sums.delegate / rounds))
print(string.format("a researcher's job costs %.2f µs more than a hook that only returns (%.1fx); delegate's own job %.2f µs (%.1fx)",
  (sums.research - sums.base) / rounds, sums.research / sums.base, (sums.delegate - sums.base) / rounds,
  sums.delegate / sums.base))
