package testinfra

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ParseProcStat reads the state (field 3) and the parent's pid (field 4) of a line of
// /proc/<pid>/stat, counted after the command name (field 2, in parentheses, which may hold
// spaces and parentheses: it ends at the last ')').
func ParseProcStat(stat string) (state byte, ppid int, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc stat without a command name: %.40q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc stat without a state and a parent: %.60q", stat)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, fmt.Errorf("/proc stat: %w", err)
	}
	return f[0][0], ppid, nil
}

// ChildProcesses lists the processes whose parent is pid. A PostgreSQL postmaster's backends,
// walsenders and walreceivers are such children, each in a session of its own (they call
// setsid): a signal to the postmaster's process group does not reach them.
func ChildProcesses(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if _, ppid, err := ParseProcStat(string(b)); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// ProcessGone reports whether process pid has exited: it is no longer there, or is a zombie
// (which holds no memory, shared or not, and which whoever adopted it may never reap).
func ProcessGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	state, _, err := ParseProcStat(string(b))
	return err != nil || state == 'Z' || state == 'X'
}
