package loader

// PID is the plugin process's id, for tests that kill it outright.
func PID(p *Plugin) int { return p.client.ReattachConfig().Pid }
