// Package records holds the Lite record directory: where the spawner writes
// one .pid record per agent it starts and the agent writes one .pgid record
// per task process group it starts, so that a server (restarted or not) can
// tell whether an attempt's processes are still there.
//
// The directory defaults to $TMPDIR/dexaflow-agent-pids-<uid>. Anyone who can
// write into it could make the server signal an arbitrary process group, so
// Open refuses a directory that is a symlink, is owned by another user, or is
// writable by group or others, and creates a missing one with mode 0700.
//
// File names are <run>__<task>__<try>__<epoch>.pid and .pgid, with the ids
// escaped by Escape (which never produces "__"). Ids too long for a file name
// are replaced by a hash; each record also carries the full attempt and a
// reader refuses a record that names another attempt.
package records

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/ownerdir"
	"github.com/dexaflow/reaper/sdk"
)

// DirPrefix starts the default directory's name; the user id ends it.
const DirPrefix = "dexaflow-agent-pids-"

// File name extensions.
const (
	AgentExt = ".pid"
	GroupExt = ".pgid"
)

// maxName keeps a record's file name, extension and a temporary suffix under
// the 255-byte limit of common file systems.
const maxName = 200

// DefaultPath is $TMPDIR/dexaflow-agent-pids-<uid>.
func DefaultPath() string {
	return filepath.Join(os.TempDir(), DirPrefix+strconv.Itoa(os.Getuid()))
}

// Dir is a verified record directory. Records are read relative to a
// descriptor of the directory that was verified, so a path swapped later
// cannot redirect the reads.
type Dir struct {
	path string
	fd   *os.File // the verified directory, open for lookups
	// Created: Open made the directory, so no agent spawned before can have
	// a record in it.
	Created bool
}

// Open verifies the record directory at path ("" means DefaultPath),
// creating it with mode 0700 when it does not exist. It refuses, naming the
// path and the reason, a directory that is a symlink, is not a directory, is
// owned by another user than the effective one, or is writable by group or
// others.
func Open(path string) (*Dir, error) {
	abs, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	d := &Dir{path: abs}
	if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return nil, fmt.Errorf("record directory %s: creating its parent: %w", abs, err)
		}
		switch err := os.Mkdir(abs, 0o700); {
		case err == nil:
			d.Created = true
		case errors.Is(err, fs.ErrExist):
			// made by someone else meanwhile: checked below like any other
		default:
			return nil, fmt.Errorf("record directory %s: creating it: %w", abs, err)
		}
	}
	if err := Check(abs); err != nil {
		return nil, err
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("record directory %s: opening it: %w", abs, err)
	}
	d.fd = os.NewFile(uintptr(fd), abs)
	// The directory opened must be the one checked, not one swapped in since.
	var byPath, byFD unix.Stat_t
	if err := unix.Lstat(abs, &byPath); err != nil {
		d.fd.Close()
		return nil, fmt.Errorf("record directory %s: %w", abs, err)
	}
	if err := unix.Fstat(fd, &byFD); err != nil {
		d.fd.Close()
		return nil, fmt.Errorf("record directory %s: %w", abs, err)
	}
	if byPath.Dev != byFD.Dev || byPath.Ino != byFD.Ino {
		d.fd.Close()
		return nil, fmt.Errorf("record directory %s is refused: it changed while being opened", abs)
	}
	if err := checkStat(abs, &byFD); err != nil {
		d.fd.Close()
		return nil, err
	}
	return d, nil
}

// Resolve is the absolute path Open would open for path ("" means
// DefaultPath). It touches nothing.
func Resolve(path string) (string, error) {
	if path == "" {
		path = DefaultPath()
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("record directory %s: %w", path, err)
	}
	return abs, nil
}

// Close releases the directory's descriptor. The Dir must not be used after.
func (d *Dir) Close() error { return d.fd.Close() }

// Check verifies an existing record directory without creating it.
func Check(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("record directory %s: %w", path, err)
	}
	return checkStat(path, &st)
}

func checkStat(path string, st *unix.Stat_t) error {
	if err := ownerdir.Refusal(st); err != nil {
		return fmt.Errorf("record directory %s is refused: %w", path, err)
	}
	return nil
}

// Path is the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// Name is the file name stem of an attempt's records.
func Name(a sdk.Attempt) string {
	return string(appendName(nil, a))
}

// appendName appends Name(a) to dst.
func appendName(dst []byte, a sdk.Attempt) []byte {
	start := len(dst)
	dst = appendEscape(dst, a.RunID)
	dst = append(dst, "__"...)
	dst = appendEscape(dst, a.TaskID)
	dst = appendTail(dst, a)
	if len(dst)-start <= maxName {
		return dst
	}
	// Too long: a hash of the ids. The hashed form has one "__" fewer than
	// an escaped one, so the two never collide.
	h := sha256.Sum256([]byte(a.RunID + "\x00" + a.TaskID))
	dst = append(dst[:start], 'h')
	dst = hex.AppendEncode(dst, h[:16])
	return appendTail(dst, a)
}

// appendTail appends the "__<try>__<epoch>" that ends a record's name.
func appendTail(dst []byte, a sdk.Attempt) []byte {
	dst = append(dst, "__"...)
	dst = strconv.AppendInt(dst, int64(a.Try), 10)
	dst = append(dst, "__"...)
	return strconv.AppendInt(dst, int64(a.Epoch), 10)
}

// AgentPath is the path of an attempt's .pid record.
func (d *Dir) AgentPath(a sdk.Attempt) string {
	return filepath.Join(d.path, Name(a)+AgentExt)
}

// GroupPath is the path of an attempt's .pgid record.
func (d *Dir) GroupPath(a sdk.Attempt) string {
	return filepath.Join(d.path, Name(a)+GroupExt)
}

// WriteAgent writes an attempt's .pid record. It never replaces an existing
// record: a second agent for the same attempt is refused.
func (d *Dir) WriteAgent(r AgentRecord) error {
	if r.PID <= 1 {
		return fmt.Errorf("writing agent record for %s: pid %d is not a process id", r.Attempt, r.PID)
	}
	return d.create(d.AgentPath(r.Attempt), r.Marshal())
}

// WriteGroup writes an attempt's .pgid record, never replacing one.
func (d *Dir) WriteGroup(r GroupRecord) error {
	if r.PGID <= 1 || r.AgentPID <= 1 || r.LeaderStart == 0 {
		return fmt.Errorf("writing group record for %s: pgid %d, agent pid %d, leader start %d: not valid",
			r.Attempt, r.PGID, r.AgentPID, r.LeaderStart)
	}
	return d.create(d.GroupPath(r.Attempt), r.Marshal())
}

// create writes data to a temporary file and links it into place, so a
// record is never seen half-written and an existing one is never replaced.
func (d *Dir) create(path string, data []byte) error {
	tmp, err := os.CreateTemp(d.path, ".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName)
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Link(tmpName, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// ReadAgent reads an attempt's .pid record. A missing record wraps
// fs.ErrNotExist; an untrustworthy one wraps ErrGarbled; any other error is
// a read error.
func (d *Dir) ReadAgent(a sdk.Attempt) (AgentRecord, error) {
	return d.Reader().ReadAgent(a)
}

// ReadGroup reads an attempt's .pgid record, with ReadAgent's errors.
func (d *Dir) ReadGroup(a sdk.Attempt) (GroupRecord, error) {
	return d.Reader().ReadGroup(a)
}

// Reader reads records of a Dir as Dir.ReadAgent and Dir.ReadGroup do, each
// from disk every time, but keeps its buffers from one read to the next: a
// batch of many attempts then allocates no name and no buffer per record.
// A Reader is for one goroutine at a time.
type Reader struct {
	d    *Dir
	name []byte // the file name being read
	buf  []byte // the record's bytes; a record parsed from them keeps none
	// boot is the boot id of the last record read: the records of one host
	// mostly share one, and a record holding it reuses the string.
	boot string
}

// Reader returns a new Reader of d.
func (d *Dir) Reader() *Reader { return &Reader{d: d} }

// ReadAgent is Dir.ReadAgent.
func (r *Reader) ReadAgent(a sdk.Attempt) (AgentRecord, error) {
	data, err := r.read(a, AgentExt)
	if err != nil {
		return AgentRecord{}, r.fail(err)
	}
	rec, err := parseAgent(data, likely{attempt: a, boot: r.boot})
	if err == nil && rec.Attempt != a {
		err = fmt.Errorf("%w: it names %s", ErrGarbled, rec.Attempt)
	}
	if err != nil {
		return AgentRecord{}, r.fail(err)
	}
	r.boot = rec.Boot
	return rec, nil
}

// ReadGroup is Dir.ReadGroup.
func (r *Reader) ReadGroup(a sdk.Attempt) (GroupRecord, error) {
	data, err := r.read(a, GroupExt)
	if err != nil {
		return GroupRecord{}, r.fail(err)
	}
	rec, err := parseGroup(data, likely{attempt: a, boot: r.boot})
	if err == nil && rec.Attempt != a {
		err = fmt.Errorf("%w: it names %s", ErrGarbled, rec.Attempt)
	}
	if err != nil {
		return GroupRecord{}, r.fail(err)
	}
	r.boot = rec.Boot
	return rec, nil
}

// read reads the record of a with extension ext into r.buf.
func (r *Reader) read(a sdk.Attempt, ext string) ([]byte, error) {
	r.name = append(appendName(r.name[:0], a), ext...)
	data, err := r.d.read(string(r.name), r.buf)
	if data != nil {
		r.buf = data
	}
	return data, err
}

// fail names the record just read in err.
func (r *Reader) fail(err error) error {
	return fmt.Errorf("reading %s: %w", filepath.Join(r.d.path, string(r.name)), err)
}

// Remove deletes an attempt's records; missing ones are fine.
func (d *Dir) Remove(a sdk.Attempt) error {
	var errs []error
	for _, p := range []string{d.GroupPath(a), d.AgentPath(a)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// Entry is one attempt with records in the directory, as its records name
// it, and the time its newest record was last written.
type Entry struct {
	Attempt  sdk.Attempt
	Modified time.Time
}

// List returns the attempts that have records in the directory. A record
// that cannot be read or parsed is skipped and counted in garbled: it is
// never the ground for removing anything.
func (d *Dir) List() (entries []Entry, garbled int, err error) {
	des, err := os.ReadDir(d.path)
	if err != nil {
		return nil, 0, fmt.Errorf("listing %s: %w", d.path, err)
	}
	seen := map[sdk.Attempt]int{}
	for _, de := range des {
		name := de.Name()
		var a sdk.Attempt
		switch {
		case strings.HasSuffix(name, AgentExt):
			data, err := d.read(name, nil)
			if err != nil {
				garbled++
				continue
			}
			r, err := ParseAgent(data)
			if err != nil {
				garbled++
				continue
			}
			a = r.Attempt
		case strings.HasSuffix(name, GroupExt):
			data, err := d.read(name, nil)
			if err != nil {
				garbled++
				continue
			}
			r, err := ParseGroup(data)
			if err != nil {
				garbled++
				continue
			}
			a = r.Attempt
		default:
			continue
		}
		if Name(a)+filepath.Ext(name) != name {
			garbled++ // a record filed under another attempt's name
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if i, ok := seen[a]; ok {
			if info.ModTime().After(entries[i].Modified) {
				entries[i].Modified = info.ModTime()
			}
			continue
		}
		seen[a] = len(entries)
		entries = append(entries, Entry{Attempt: a, Modified: info.ModTime()})
	}
	return entries, garbled, nil
}

// RemoveGroup deletes an attempt's .pgid record; a missing one is fine.
func (d *Dir) RemoveGroup(a sdk.Attempt) error {
	if err := os.Remove(d.GroupPath(a)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", d.GroupPath(a), err)
	}
	return nil
}

// read reads the record name with one open and (for a record of usual
// size) one read, relative to the verified directory. A missing record
// wraps fs.ErrNotExist; a symlink, a directory or a file larger than
// MaxRecordSize wraps ErrGarbled. The record is read into buf when it is
// large enough, else into a new buffer.
func (d *Dir) read(name string, buf []byte) ([]byte, error) {
	fd, err := unix.Openat(int(d.fd.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, fs.ErrNotExist
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%w: it is a symlink", ErrGarbled)
	case err != nil:
		return nil, err
	}
	defer unix.Close(fd)
	// A record is a few hundred bytes: start small, grow to the limit.
	if cap(buf) < 512 {
		buf = make([]byte, 512)
	}
	buf = buf[:min(cap(buf), MaxRecordSize+1)]
	n := 0
	for {
		m, err := readFull(fd, buf[n:])
		n += m
		switch {
		case errors.Is(err, unix.EISDIR):
			return nil, fmt.Errorf("%w: it is a directory", ErrGarbled)
		case err != nil:
			return nil, err
		case n > MaxRecordSize:
			return nil, fmt.Errorf("%w: larger than %d bytes", ErrGarbled, MaxRecordSize)
		case n < len(buf):
			return buf[:n], nil
		}
		buf = append(buf, make([]byte, min(2*len(buf), MaxRecordSize+1)-len(buf))...)
	}
}

// readFull reads until end-of-file or a full buffer. A regular file's read
// returns less than asked only at its end, so a record takes one read.
func readFull(fd int, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		want := len(buf) - n
		m, err := unix.Read(fd, buf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
		if m < want {
			return n, nil
		}
	}
	return n, nil // full: the caller sees more than MaxRecordSize bytes
}
