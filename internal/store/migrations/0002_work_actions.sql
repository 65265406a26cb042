-- work_actions records each action of a work item's flow (node jobs: Check,
-- BackUp, Upgrade, ...), written before the action runs (state Running) and
-- after it ends (Succeeded or Failed), so that a restarted agent resumes or
-- rolls back a flow instead of repeating a finished action. data is the
-- action's own JSON (e.g. a pending upgrade's versions and deadline);
-- reported is 1 once the action's end went into the outbox. rowid order is
-- the order in which the actions first ran.
CREATE TABLE work_actions (
    uid        TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    reason     TEXT    NOT NULL DEFAULT '',
    data       BLOB    NOT NULL DEFAULT x'',
    reported   INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    UNIQUE (uid, action)
);
CREATE INDEX work_actions_state ON work_actions (state);
