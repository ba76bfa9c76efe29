-- A site's own job_submit.lua (slurmctld's JobSubmitPlugins=lua) with
-- delegate's gate added (docs/existing-site.md). What the site admin does:
--   1. renames the script's own slurm_job_submit to site_job_submit and its
--      slurm_job_modify to site_job_modify (early returns stay as they are);
--   2. puts the block between the "delegate: begin" and "delegate: end"
--      lines below after them (before the file's final `return`, if any).
-- The site's rules keep their place and run first; delegate's check runs
-- last, on the job as the site's rules left it, and returns at once for a
-- job outside delegate's partitions. tests/site/site.sh makes exactly this
-- edit to its site's job_submit.lua; tests/lua/job_submit_test.lua loads
-- this file.

-- The site's own rule (an example): a job without a time limit gets 60 minutes.
local function site_job_submit(job_desc, part_list, submit_uid)
   if job_desc.time_limit == nil or job_desc.time_limit == 4294967294 then
      job_desc.time_limit = 60
   end
   return slurm.SUCCESS
end

local function site_job_modify(job_desc, job_ptr, part_list, modify_uid)
   return slurm.SUCCESS
end

-- delegate: begin
-- delegate's gate (delegate-deploy gate --module). Fail closed: a gate that
-- does not load refuses every job (a slurmctld log line says why), and a
-- site rule that raises or returns no number refuses the job; in Slurm an
-- error here would ACCEPT it.
local delegate_ok, delegate = pcall(dofile, "/etc/slurm/delegate_gate.lua")
if not delegate_ok or type(delegate) ~= "table" or type(delegate.job_submit) ~= "function"
   or type(delegate.job_modify) ~= "function" then
   slurm.log_error("delegate: /etc/slurm/delegate_gate.lua did not load (%s); every job is refused", tostring(delegate))
   local function refuse()
      slurm.log_user("delegate: the site's job check is not loaded; tell the administrators")
      return slurm.ESLURM_ACCESS_DENIED
   end
   delegate = { job_submit = refuse, job_modify = refuse }
end

local function delegate_site_rc(ok, rc)
   if not ok or type(rc) ~= "number" then
      slurm.log_error("delegate: the site's own job_submit rule failed (%s); job refused", tostring(rc))
      return slurm.ESLURM_ACCESS_DENIED
   end
   return rc
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local rc = delegate_site_rc(pcall(site_job_submit, job_desc, part_list, submit_uid))
   if rc ~= slurm.SUCCESS then return rc end
   return delegate.job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_ptr, part_list, modify_uid)
   local rc = delegate_site_rc(pcall(site_job_modify, job_desc, job_ptr, part_list, modify_uid))
   if rc ~= slurm.SUCCESS then return rc end
   return delegate.job_modify(job_desc, job_ptr, part_list, modify_uid)
end
-- delegate: end

return slurm.SUCCESS
