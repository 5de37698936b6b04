-- A worker ($2) of subscription $1 is busy again: producers need not wake it.
DELETE FROM {schema}.idle_workers WHERE subscription = $1 AND worker_id = $2
