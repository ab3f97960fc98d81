package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	goplugin "github.com/hashicorp/go-plugin"
)

// socketDirPrefix begins the name of the directory a plugin's gRPC socket
// is made in: rpsock-<host pid>-<random>, under the temporary directory
// (short: a Unix socket's whole path must fit in about 100 bytes).
//
// go-plugin makes a plugin's Unix socket where the plugin process says, and
// only the plugin removes it, on a clean exit. A plugin that is killed (a
// crash, kill -9, the OOM killer, its host killed and taking it along)
// would leave its socket behind for good, one per crash. So the host gives
// each plugin a directory of its own (PLUGIN_UNIX_SOCKET_DIR), removes it
// whenever it kills or reaps the plugin, and, the first time a Loader
// launches, removes the directories of hosts that no longer run.
const socketDirPrefix = "rpsock-"

// makeSocketDir makes the directory for one plugin's socket.
func makeSocketDir() (string, error) {
	dir, err := os.MkdirTemp("", socketDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("make the plugin's socket directory: %w", err)
	}
	return dir, nil
}

// socketEnv points the plugin at its socket directory.
func socketEnv(dir string) string { return goplugin.EnvUnixSocketDir + "=" + dir }

// sweepSocketDirs removes, under base, the socket directories of hosts
// whose process no longer exists. A directory whose host pid now names
// another process is kept: only a delay, never a socket of a live host
// removed.
func sweepSocketDirs(base string) []string {
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var removed []string
	for _, ent := range ents {
		name := ent.Name()
		if !ent.IsDir() || !strings.HasPrefix(name, socketDirPrefix) {
			continue
		}
		rest := strings.TrimPrefix(name, socketDirPrefix)
		i := strings.IndexByte(rest, '-')
		if i <= 0 {
			continue
		}
		pid, err := strconv.Atoi(rest[:i])
		if err != nil || pid <= 0 || pid == os.Getpid() || processExists(pid) {
			continue
		}
		if os.RemoveAll(filepath.Join(base, name)) == nil {
			removed = append(removed, name)
		}
	}
	return removed
}

// processExists probes pid with signal 0; anything but "no such process"
// counts as existing.
func processExists(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, syscall.ESRCH)
}
