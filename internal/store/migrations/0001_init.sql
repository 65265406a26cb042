-- identity is the node's single identity row (id is always 1).
CREATE TABLE identity (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    node       TEXT    NOT NULL,
    key_pem    BLOB    NOT NULL,
    cert_pem   BLOB    NOT NULL,
    ca_pem     BLOB    NOT NULL,
    hub        TEXT    NOT NULL,
    updated_at INTEGER NOT NULL -- unix nanoseconds
);

-- revision holds the protocol's counters: 'hub' is the hub->agent revision the
-- agent has applied, 'agent' the revision of the agent's own reports.
-- Values are uint64 stored as their int64 bit pattern.
CREATE TABLE revision (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO revision (name, value) VALUES ('hub', 0), ('agent', 0);

-- work holds the items the hub delivered. rowid order is delivery order.
CREATE TABLE work (
    uid        TEXT    NOT NULL UNIQUE,
    type       TEXT    NOT NULL,
    spec       BLOB    NOT NULL,
    phase      TEXT    NOT NULL DEFAULT '',
    reason     TEXT    NOT NULL DEFAULT '',
    revision   INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- outbox holds agent->hub messages until they are acked. seq is send order.
CREATE TABLE outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT    NOT NULL UNIQUE,
    data       BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0
);
