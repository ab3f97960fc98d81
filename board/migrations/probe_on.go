//go:build reaper_upgrade_probe

package migrations

import "embed"

// Probe holds the upgrade probe's migration (this build has the tag
// reaper_upgrade_probe): see the package documentation.
//
//go:embed probe/*.sql
var Probe embed.FS
