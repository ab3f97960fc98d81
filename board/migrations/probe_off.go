//go:build !reaper_upgrade_probe

package migrations

import "embed"

// Probe is empty: the upgrade probe's migration is embedded only in a
// build with the tag reaper_upgrade_probe (see the package documentation).
var Probe embed.FS
