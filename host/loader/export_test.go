package loader

// SetBeforeStart sets the hook that runs after the binary was opened and
// checked and before it is started.
func SetBeforeStart(l *Loader, f func(path string)) { l.beforeStart = f }
