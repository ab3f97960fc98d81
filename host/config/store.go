package config

import (
	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/sdk"
)

// EnvDSN overrides store.dsn when set.
const EnvDSN = "REAPER_DSN"

var storeSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "dsn", Type: sdk.TypeString},
}}

func (cfg *Config) decodeStore(b *hcl.Block) hcl.Diagnostics {
	v, _, diags := DecodeBlock(b.Body, storeSchema)
	cfg.StoreDSN = v.String("dsn")
	return diags
}
