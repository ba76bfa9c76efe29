-- The test site's own job_submit.lua, before delegate (tests/site/): one
-- rule of its own. site.sh then edits it as docs/existing-site.md says: the
-- two functions renamed, delegate's block added before the final return.
function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.time_limit == nil or job_desc.time_limit == 4294967294 then
      job_desc.time_limit = 60
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_ptr, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
