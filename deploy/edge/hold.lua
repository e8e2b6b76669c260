-- Requirement 5 of the edge (deploy/edge/README.md): when no ingress path is open, a beacon
-- waits briefly for one instead of getting a 503 at once.
--
--   http-request lua.hold_for_ingress <backend> <max milliseconds>
--
-- Polls the number of usable servers of <backend> (HAProxy's `nbsrv` fetch, which follows the
-- health checks) every 100 ms while it is 0, for at most <max milliseconds>; then lets the
-- request go on to the backend, which answers 503 if still no path is open. core.msleep yields:
-- the thread serves other requests meanwhile, and the sleep does not count towards
-- tune.lua.session-timeout. The time held is logged as the variable txn.held_ms.
core.register_action("hold_for_ingress", { "http-req" }, function(txn, backend, max_ms)
    local limit = tonumber(max_ms) or 0
    local waited = 0
    while waited < limit and txn.f:nbsrv(backend) == 0 do
        core.msleep(100)
        waited = waited + 100
    end
    if waited > 0 then
        txn:set_var("txn.held_ms", waited)
    end
end, 2)
