package pgtest_test

import (
	"os"
	"syscall"
)

func statUID(st os.FileInfo) uint32 { return st.Sys().(*syscall.Stat_t).Uid }
