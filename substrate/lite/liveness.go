package lite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"strconv"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Liveness answers for each attempt from its records and the processes they
// name (see the package documentation for the rules). The answers are in the
// order of req.Attempts. An error is returned only when the substrate is not
// configured or ctx ends; a problem with one attempt reads unknown.
func (s *Substrate) Liveness(ctx context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	st, err := s.settings()
	if err != nil {
		return nil, err
	}
	return Probe(ctx, st.dir, req.Attempts, s.log)
}

// probeChunk is the fewest attempts worth a goroutine of their own.
const probeChunk = 128

// Probe reads the liveness of a batch of attempts from the records in dir.
func Probe(ctx context.Context, dir *records.Dir, attempts []sdk.Attempt, log hclog.Logger) ([]sdk.AttemptLiveness, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	b := &batch{dir: dir, log: log}
	if boot, err := proc.BootID(); err == nil {
		b.boot = boot
	}
	out := make([]sdk.AttemptLiveness, len(attempts))
	workers := max(1, min(runtime.GOMAXPROCS(0), (len(attempts)+probeChunk-1)/probeChunk))
	per := (len(attempts) + workers - 1) / workers
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*per, min((w+1)*per, len(attempts))
		wg.Go(func() {
			// Each worker keeps what it read of a process for the rest of
			// the batch: one observation, and no lock between workers.
			f := b.facts(true)
			for i := lo; i < hi; i++ {
				if (i-lo)%probeChunk == 0 && ctx.Err() != nil {
					return
				}
				out[i] = f.probe(attempts[i])
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("probing attempts: %w", ctx.Err())
	}
	return out, nil
}

// batch is one observation of many attempts: the boot id is read once and
// the process table is scanned at most once.
type batch struct {
	dir  *records.Dir
	log  hclog.Logger
	boot string

	scanOnce sync.Once
	groups   *proc.Groups
	scanErr  error
}

func (b *batch) scan() (*proc.Groups, error) {
	b.scanOnce.Do(func() { b.groups, b.scanErr = proc.ScanGroups() })
	return b.groups, b.scanErr
}

// rebooted reports whether a record written in boot names a previous boot.
func (b *batch) rebooted(boot string) bool {
	return boot != "" && b.boot != "" && boot != b.boot
}

// facts is one worker's view of the processes of a batch. With caching on,
// a PID's stat, a PID's signal-0 answer and a group's signal-0 answer are
// each read once per batch.
type facts struct {
	b      *batch
	stats  map[int]statResult
	procs  map[int]existsResult
	groups map[int]existsResult
	// records reads the attempts' records, each from disk, with buffers
	// kept across the batch.
	records *records.Reader
	// notes is the detail of the attempt being judged: its notes joined by
	// "; ". The buffer is kept from one attempt to the next, so a note
	// costs no allocation of its own.
	notes []byte
}

// note adds s to the detail of the attempt being judged.
func (f *facts) note(s string) {
	if len(f.notes) > 0 {
		f.notes = append(f.notes, "; "...)
	}
	f.notes = append(f.notes, s...)
}

// noteID adds before, id in decimal and after: the note of a common answer,
// written without fmt.
func (f *facts) noteID(before string, id int, after string) {
	f.note(before)
	f.notes = strconv.AppendInt(f.notes, int64(id), 10)
	f.notes = append(f.notes, after...)
}

// detail is the notes added since the last reset.
func (f *facts) detail() string { return string(f.notes) }

func (f *facts) resetNotes() { f.notes = f.notes[:0] }

type statResult struct {
	info proc.Info
	err  error
}

type existsResult struct {
	exists bool
	err    error
}

func (b *batch) facts(cache bool) *facts {
	f := &facts{b: b}
	if b.dir != nil {
		f.records = b.dir.Reader()
	}
	if cache {
		f.stats = make(map[int]statResult)
		f.procs = make(map[int]existsResult)
		f.groups = make(map[int]existsResult)
	}
	return f
}

func (f *facts) stat(pid int) (proc.Info, error) {
	if f.stats == nil {
		return proc.Stat(pid)
	}
	if r, ok := f.stats[pid]; ok {
		return r.info, r.err
	}
	info, err := proc.Stat(pid)
	f.stats[pid] = statResult{info, err}
	return info, err
}

func (f *facts) exists(pid int) (bool, error) { return observe(f.procs, pid, proc.Exists) }

func (f *facts) groupExists(pgid int) (bool, error) { return observe(f.groups, pgid, proc.GroupExists) }

// observe answers probe(id) once per batch: from seen when it was asked
// before, else probed and kept there. Without seen (no caching), every
// call probes.
func observe(seen map[int]existsResult, id int, probe func(int) (bool, error)) (bool, error) {
	if seen == nil {
		return probe(id)
	}
	if r, ok := seen[id]; ok {
		return r.exists, r.err
	}
	exists, err := probe(id)
	seen[id] = existsResult{exists, err}
	return exists, err
}

func (f *facts) probe(a sdk.Attempt) sdk.AttemptLiveness {
	b := f.b
	out := sdk.AttemptLiveness{Attempt: a}
	f.resetNotes()

	// The group record, once the agent has written it, names the agent too
	// (PID and start time): a running attempt costs one record read.
	verified := false
	grec, gerr := f.records.ReadGroup(a)
	switch {
	case gerr == nil:
		out.Agent = f.agent(grec.AgentPID, grec.AgentStart, grec.Boot)
		out.Group, verified = f.group(grec)
	case errors.Is(gerr, fs.ErrNotExist):
		out.Group = sdk.Dead
		f.note("no group recorded")
	case errors.Is(gerr, records.ErrGarbled):
		b.log.Warn("group record is garbled: reading the attempt as unknown", "attempt", a.String(),
			"path", b.dir.GroupPath(a), "error", gerr)
		out.Group = sdk.Unknown
		f.note("group record garbled")
	default:
		out.Group = sdk.Unknown
		f.note("group record unreadable: " + gerr.Error())
	}
	if gerr != nil {
		arec, aerr := f.records.ReadAgent(a)
		switch {
		case aerr == nil:
			out.Agent = f.agent(arec.PID, arec.Start, arec.Boot)
		case errors.Is(aerr, fs.ErrNotExist):
			out.Agent = sdk.Dead
			f.note("no agent record")
		case errors.Is(aerr, records.ErrGarbled):
			b.log.Warn("agent record is garbled: reading the attempt as unknown", "attempt", a.String(),
				"path", b.dir.AgentPath(a), "error", aerr)
			out.Agent = sdk.Unknown
			f.note("agent record garbled")
		default:
			out.Agent = sdk.Unknown
			f.note("agent record unreadable: " + aerr.Error())
		}
	}

	switch {
	case out.Agent == sdk.Alive || out.Group == sdk.Alive:
		out.State = sdk.Alive
	case out.Agent == sdk.Unknown || out.Group == sdk.Unknown:
		out.State = sdk.Unknown
	default:
		out.State = sdk.Dead
	}
	out.Orphan = out.Agent == sdk.Dead && out.Group == sdk.Alive && verified
	out.Detail = f.detail()
	return out
}

// agent judges an agent process. start is 0 when not recorded.
func (f *facts) agent(pid int, start uint64, boot string) sdk.Liveness {
	if f.b.rebooted(boot) {
		f.note("agent recorded before a reboot")
		return sdk.Dead
	}
	return f.agentLiveness(pid, start)
}

func (f *facts) agentLiveness(pid int, start uint64) sdk.Liveness {
	// The process table first: a readable entry proves the PID exists and
	// tells a zombie or a reused PID apart. Signal 0 answers when it cannot.
	info, err := f.stat(pid)
	switch {
	case err == nil && info.Zombie:
		f.noteID("agent ", pid, " exited (zombie)")
		return sdk.Dead
	case err == nil && start != 0 && info.Start != start:
		f.noteID("agent pid ", pid, " now names another process")
		return sdk.Dead
	case err == nil:
		f.noteID("agent ", pid, " alive")
		return sdk.Alive
	case !errors.Is(err, proc.ErrNotExist) && !errors.Is(err, proc.ErrUnsupported):
		f.note("agent unreadable: " + err.Error())
		return sdk.Unknown
	}
	// Gone from the table, or no table here: signal 0 (it also sees a
	// process the table hides from this user).
	exists, err := f.exists(pid)
	switch {
	case err != nil:
		f.note("agent probe failed: " + err.Error())
		return sdk.Unknown
	case !exists:
		f.noteID("agent ", pid, " gone")
		return sdk.Dead
	}
	f.noteID("agent ", pid, " answers signal 0")
	return sdk.Alive
}

// group judges a recorded task group; verified means its leader is the
// recorded process, so the group may be signalled.
func (f *facts) group(rec records.GroupRecord) (sdk.Liveness, bool) {
	if f.b.rebooted(rec.Boot) {
		f.note("group recorded before a reboot")
		return sdk.Dead, false
	}
	return f.groupLiveness(rec)
}

// running tells whether a group whose leader is gone has a running member:
// the batch's scan first; a "no" is confirmed by fresh looks.
func (b *batch) running(pgid int) (bool, error) {
	g, err := b.scan()
	if err == nil && g.Running(pgid) {
		return true, nil
	}
	return proc.GroupRunning(pgid)
}

func (f *facts) groupLiveness(rec records.GroupRecord) (sdk.Liveness, bool) {
	pgid := rec.PGID
	if !proc.Supported {
		f.note("process groups cannot be probed on this platform")
		return sdk.Unknown, false
	}
	info, serr := f.stat(pgid)
	switch {
	case serr == nil && info.Start != rec.LeaderStart:
		// The PID was reused, which the OS does not do while it is still a
		// group id: nothing of the recorded group is left.
		f.note(fmt.Sprintf("group %d gone: pid %d now names another process", pgid, pgid))
		return sdk.Dead, false
	case serr == nil && !info.Zombie && info.PGID == pgid:
		// The recorded leader runs and still leads its group.
		f.noteID("group ", pgid, " alive")
		return sdk.Alive, true
	}
	exists, err := f.groupExists(pgid)
	if err != nil {
		f.note("group probe failed: " + err.Error())
		return sdk.Unknown, false
	}
	if !exists {
		f.noteID("group ", pgid, " gone")
		return sdk.Dead, false
	}
	members := func(why string) (sdk.Liveness, bool) {
		run, err := f.b.running(pgid)
		switch {
		case err != nil:
			f.note(fmt.Sprintf("group %d: %s; members unreadable: %v", pgid, why, err))
			return sdk.Unknown, false
		case run:
			f.note(fmt.Sprintf("group %d alive, unverifiable: %s", pgid, why))
			return sdk.Alive, false
		default:
			f.note(fmt.Sprintf("group %d: %s; only zombies left", pgid, why))
			return sdk.Dead, false
		}
	}
	switch {
	case errors.Is(serr, proc.ErrNotExist):
		return members("its leader exited")
	case serr != nil:
		f.note(fmt.Sprintf("group %d alive, unverifiable: leader unreadable: %v", pgid, serr))
		return sdk.Alive, false
	case info.Zombie:
		return members("its leader exited")
	default: // the leader moved to another group
		f.note(fmt.Sprintf("group %d alive, unverifiable: its leader moved to group %d", pgid, info.PGID))
		return sdk.Alive, false
	}
}
