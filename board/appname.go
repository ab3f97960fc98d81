package board

import (
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxApplicationName is the longest application_name PostgreSQL keeps
// (NAMEDATALEN-1 bytes); the server cuts a longer one there.
const MaxApplicationName = 63

// NameConnections names a pool's connections (application_name) name,
// unless the DSN names them itself or name is empty. reaperd names its
// pools by its leader identity (its holder): pg_stat_activity then tells
// which replica holds which connection, and a trigger or an audit of the
// database's own can tell which replica wrote a row
// (current_setting('application_name')). A name longer than PostgreSQL
// keeps is cut, at a character boundary, to its first MaxApplicationName
// bytes.
func NameConnections(cfg *pgxpool.Config, name string) {
	if name == "" || cfg.ConnConfig.RuntimeParams["application_name"] != "" {
		return
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = cutName(name, MaxApplicationName)
}

// cutName cuts s to at most n bytes without splitting a character.
func cutName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
