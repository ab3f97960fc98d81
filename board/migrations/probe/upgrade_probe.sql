-- reaper: additive
-- The upgrade probe: a migration that changes nothing, embedded only in a
-- build with the tag reaper_upgrade_probe. Its version is one past the
-- newest product migration. It is additive, so a binary one release older
-- (which does not know it) still runs on a database that holds it.
SELECT 1;
