package config

import (
	"github.com/hashicorp/hcl/v2"
)

// EnvDSN overrides store.dsn when set.
const EnvDSN = "REAPER_DSN"

// storeBlock is the store block.
type storeBlock struct {
	DSN string `reaper:"dsn"` // the board's PostgreSQL; EnvDSN overrides it
}

func (cfg *Config) decodeStore(b *hcl.Block) hcl.Diagnostics {
	var sb storeBlock
	_, diags := decodeInto(b.Body, &sb)
	cfg.StoreDSN = sb.DSN
	return diags
}
