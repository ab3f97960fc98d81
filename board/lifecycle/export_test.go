package lifecycle

// HeartbeatSQL is HeartbeatCredentials' statement, for EXPLAIN.
var HeartbeatSQL = heartbeatSQL
