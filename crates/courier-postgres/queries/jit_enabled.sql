-- Whether this connection would JIT-compile an expensive plan: `jit` on and
-- a non-negative `jit_above_cost` (-1 turns JIT off). Courier's claim plans
-- cross the default threshold once a backlog's table has statistics, and
-- compiling costs more than running them.
-- Touches: no table; locks nothing.
SELECT current_setting('jit')::boolean
   AND current_setting('jit_above_cost')::float8 >= 0
