-- A site's own job_submit.lua (slurmctld's JobSubmitPlugins=lua) with
-- delegate's gate added: the lines marked "delegate" are all a site adds
-- (docs/existing-site.md). The site's own rules keep their place; delegate's
-- check runs last, on the job as the site's rules left it, and returns at
-- once for a job outside delegate's partitions.
-- tests/lua/job_submit_test.lua loads this very file.

local delegate = dofile("/etc/slurm/delegate_gate.lua")  -- delegate

-- The site's own rule (an example): a job without a time limit gets 60 minutes.
local function site_job_submit(job_desc, part_list, submit_uid)
   if job_desc.time_limit == nil or job_desc.time_limit == 4294967294 then
      job_desc.time_limit = 60
   end
   return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local rc = site_job_submit(job_desc, part_list, submit_uid)
   if rc ~= slurm.SUCCESS then return rc end
   return delegate.job_submit(job_desc, part_list, submit_uid)  -- delegate
end

function slurm_job_modify(job_desc, job_ptr, part_list, modify_uid)
   return delegate.job_modify(job_desc, job_ptr, part_list, modify_uid)  -- delegate
end

return slurm.SUCCESS
