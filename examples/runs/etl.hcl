# A run file for `reaperctl submit -file`: one run, its tasks and what each
# waits for. extract runs first; clean and count run once it succeeded;
# load runs once both did. A task whose upstream fails for good is settled
# upstream_failed without running, and the run finishes failed.
dag = "etl"

task "extract" {
  command = "echo extracting; sleep 2"
  retries = 2
  timeout = "10m"
}

task "clean" {
  command  = "echo cleaning"
  upstream = ["extract"]
}

task "count" {
  command  = "echo counting"
  upstream = ["extract"]
}

task "load" {
  command  = "echo loading"
  upstream = ["clean", "count"]
  timeout  = "30m"
}
