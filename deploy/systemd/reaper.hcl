# /etc/reaper/reaper.hcl: reaperd with the Lite runner on one host, as
# reaperd.service runs it. config.hcl.example at the top of the repository
# describes every key; this file sets only what a host install changes.
#
# Check it with: reaperd validate -config /etc/reaper/reaper.hcl

edition    = "lite"
plugin_dir = "/usr/local/bin"   # reaperd, the plugins and reaper-agent

# Start dry: the reapers decide, meter and audit, but write and stop nothing.
# Read their decisions with `reaperctl explain RUN TASK` and the
# dexaflow_scheduler_decisions_total{dry_run="true"} series, then set false.
# (The Lite runner is not a reaper: it schedules and dispatches either way.)
dry_run = true

store {
  # REAPER_DSN from /etc/reaper/reaperd.env overrides this value, so the
  # password need not be written here.
  dsn = "postgres://reaper@127.0.0.1:5432/reaper?sslmode=disable"
}

leader "postgres" {
  lease = "15s"
}

maintenance {
  interval = "30s"
}

telemetry {
  listen = "127.0.0.1:9464"   # /metrics and /monitor/health, for the local Prometheus
}

# Agents report here with their attempt's own credential. The signing key and
# the loopback certificate are generated once into state_dir (default
# $TMPDIR/dexaflow-attempt-api-<uid>, under this unit /run/reaper/...).
attempt_api {
  listen = "127.0.0.1:9465"
}

substrate "lite" {
  # Empty: $TMPDIR/dexaflow-agent-pids-<uid>, which the unit keeps in
  # /run/reaper across restarts. Set a path only if it, too, survives them.
  record_dir = ""
}

runner {
  max_parallel = 0
  log_dir      = "/var/log/reaper"   # the unit's LogsDirectory
}

reaper "dispatchlost" {}
reaper "agentlost" {}
reaper "orphanrun" {}
