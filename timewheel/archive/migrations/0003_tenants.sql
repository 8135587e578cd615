-- Tenants and API key hashes (timewheel/archive/tenancy.py): kept current by the archiver
-- from the tenant change log (archive_checkpoints row shard = -1) and by every snapshot.
-- `definition` is the tenant's JSON as Redis holds it ({limits, created_ms}).
CREATE TABLE tenants (
    tenant_id   text PRIMARY KEY,
    definition  jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per API key ever seen, by the SHA-256 of the key (the key itself is stored
-- nowhere). A revoked key keeps its row with revoked_at set: restore skips it.
CREATE TABLE api_keys (
    digest      text PRIMARY KEY,
    tenant      text,
    key_id      text NOT NULL,
    role        text NOT NULL,
    info        jsonb NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant);
