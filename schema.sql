-- mqtt-inbox schema: the one source of truth. The library embeds this file at build time.
--
-- It is a sequence of steps, each opened by a line "-- @version N" and ending with
-- PRAGMA user_version = N. Opening a database applies, in order and each in its own
-- transaction, every step above the database's user_version: a new file gets them all,
-- a file made by an older release gets exactly the steps it lacks. A released step is
-- never edited; a change is a new step at the end.
--
-- Time columns hold milliseconds as INTEGER. *_at columns of dead letters and attempts
-- are Unix wall-clock time; received_at of inbox_processed and inbox_messages is the
-- inbox's retention clock (see README "Clock safety"), which never jumps with the wall
-- clock.

-- @version 1

-- auto_vacuum must be chosen before the first table exists; INCREMENTAL lets the
-- retention pass give freed pages back to the file system (PRAGMA incremental_vacuum).
PRAGMA auto_vacuum = INCREMENTAL;

-- One row per (consumer, producer-assigned message id) whose effect has committed.
-- The primary key is the claim: INSERT ... ON CONFLICT DO NOTHING changing zero rows
-- means "already processed". WITHOUT ROWID keeps it to one b-tree (no separate rowid
-- table plus unique index), which means fewer pages written per commit on flash.
CREATE TABLE IF NOT EXISTS inbox_processed (
    consumer_name  TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    received_at    INTEGER NOT NULL,
    -- Debugging metadata only; never part of deduplication.
    topic          TEXT,
    message_type   TEXT,
    correlation_id TEXT,
    payload_hash   INTEGER,           -- 64-bit FNV-1a of the payload bytes
    PRIMARY KEY (consumer_name, message_id)
) WITHOUT ROWID;

-- Serves the retention pass: delete by received_at range, not by full scan.
CREATE INDEX IF NOT EXISTS inbox_processed_received_at
    ON inbox_processed (received_at);

-- Delivery attempts of messages that have not (yet) committed. A row is written and
-- committed before the handler runs, so a handler that kills the process is still
-- counted; the row is deleted in the same transaction as a successful claim, or when
-- the message is dead-lettered. state is 'running' while the handler runs and
-- 'failed' after it threw: 'running' seen on a later delivery means the process died.
CREATE TABLE IF NOT EXISTS inbox_attempts (
    consumer_name    TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    first_attempt_at INTEGER NOT NULL,
    last_attempt_at  INTEGER NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('running', 'failed')),
    last_error       TEXT,
    PRIMARY KEY (consumer_name, message_id)
) WITHOUT ROWID;

-- Messages that could not be processed. A separate state from processed: a dead
-- letter is never a claim, so a replay can still apply it once.
CREATE TABLE IF NOT EXISTS inbox_dead_letters (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'handler_failed', 'handler_crashed')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    status            TEXT    NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed')),
    replayed_at       INTEGER
);
CREATE INDEX IF NOT EXISTS inbox_dead_letters_by_id
    ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX IF NOT EXISTS inbox_dead_letters_by_time
    ON inbox_dead_letters (dead_lettered_at);

-- Small key/value facts about this database (declared redelivery horizon, opt-ins).
CREATE TABLE IF NOT EXISTS inbox_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

PRAGMA user_version = 1;

-- @version 2
-- Store-then-process: messages are stored on receipt (the PUBACK follows that commit) and
-- processed later by workers, in arrival order per aggregate key. (consumer_name,
-- message_id) is unique, so a redelivery is dropped at receipt; a row marked 'done' in
-- the same transaction as the business change is never processed twice.
CREATE TABLE IF NOT EXISTS inbox_messages (
    seq             INTEGER PRIMARY KEY,  -- arrival order; breaks received_at ties
    consumer_name   TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    aggregate_key   TEXT    NOT NULL DEFAULT '',
    topic           TEXT    NOT NULL,
    payload         BLOB,                 -- NULL once a done row is compacted
    properties      TEXT,                 -- MQTT 5 properties as a JSON object
    qos             INTEGER NOT NULL,
    received_at     INTEGER NOT NULL,     -- retention clock, ms
    status          TEXT    NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'processing', 'done', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    claimed_at      INTEGER,              -- wall clock, ms
    claimant        TEXT,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,  -- wall clock, ms: retry backoff
    last_error      TEXT,
    done_at         INTEGER,              -- retention clock, ms
    UNIQUE (consumer_name, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_messages_work
    ON inbox_messages (consumer_name, status, aggregate_key, seq);
CREATE INDEX IF NOT EXISTS inbox_messages_received_at
    ON inbox_messages (received_at);
-- Serves compaction: only 'done' rows that still hold their payload (a short window), so
-- the pruner never scans the days of compacted rows kept for deduplication.
CREATE INDEX IF NOT EXISTS inbox_messages_compact
    ON inbox_messages (consumer_name, done_at) WHERE status = 'done' AND payload IS NOT NULL;

PRAGMA user_version = 2;

-- @version 3
-- Dead letters have their own retention, measured on the retention clock like
-- inbox_processed.received_at, so a wall-clock jump cannot expire them early.
ALTER TABLE inbox_dead_letters ADD COLUMN retention_at INTEGER;  -- retention clock, ms
UPDATE inbox_dead_letters SET retention_at = dead_lettered_at WHERE retention_at IS NULL;
CREATE INDEX IF NOT EXISTS inbox_dead_letters_retention
    ON inbox_dead_letters (retention_at);

PRAGMA user_version = 3;

-- @version 4
-- The persistent sessions of this device as the MQTT subscriber records them
-- (Inbox::record_session, include/mqtt_inbox/session_record.h): per client id, the topic
-- filters the broker's session holds for it and how long the broker keeps that session
-- after a disconnect. The subscriber UNSUBSCRIBEs recorded filters that are no longer
-- configured, and the Pruner refuses a retention window shorter than the longest recorded
-- session expiry plus its margin: an id must outlive every redelivery of its message.
CREATE TABLE IF NOT EXISTS inbox_sessions (
    client_id          TEXT    PRIMARY KEY,
    session_expiry_ms  INTEGER NOT NULL CHECK (session_expiry_ms >= 0),
    expiry_source      TEXT    NOT NULL
                           CHECK (expiry_source IN ('requested', 'granted', 'declared')),
    updated_at         INTEGER NOT NULL   -- wall clock, ms
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_session_filters (
    client_id     TEXT NOT NULL REFERENCES inbox_sessions (client_id) ON DELETE CASCADE,
    topic_filter  TEXT NOT NULL,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;

PRAGMA user_version = 4;

-- @version 5
-- A dead-letter reason for retained messages ('retained', ConsumerOptions::retained).
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt as
-- https://sqlite.org/lang_altertable.html#otheralter describes: same columns in the same
-- order, same rows and ids, same indexes. No other table, view or trigger refers to it.
CREATE TABLE inbox_dead_letters_v5 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'handler_failed', 'handler_crashed',
                          'retained')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    status            TEXT    NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v5
    SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos,
           reason, reason_text, attempts, first_attempt_at, last_attempt_at,
           dead_lettered_at, redeliveries, status, replayed_at, retention_at
      FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v5 RENAME TO inbox_dead_letters;
CREATE INDEX IF NOT EXISTS inbox_dead_letters_by_id
    ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX IF NOT EXISTS inbox_dead_letters_by_time
    ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX IF NOT EXISTS inbox_dead_letters_retention
    ON inbox_dead_letters (retention_at);

PRAGMA user_version = 5;

-- @version 6
-- One write transaction per message (issue 14). The received_at index added a WAL page to
-- every message's commit (its newest leaf: +1.26 frames on 3.33, measured by
-- scripts/bench.sh "pages per commit"), for the pruner only. The pruner now walks the
-- primary key in key order instead (src/store/sqlite/retention_rows.cpp), which also deletes a
-- batch of ids from a few neighbouring pages rather than one page per id.
DROP INDEX IF EXISTS inbox_processed_received_at;

PRAGMA user_version = 6;

-- @version 7
-- Dead letters get two reasons and a status (issue 18): 'invalid_payload' (the handler threw
-- RejectMessage: well-formed input the application refuses), 'handler_reentered' (the
-- handler called back into its own inbox, which would have deadlocked), and status
-- 'requeued' (the admin tool asked the running Consumer to replay the row). Every reason of
-- step 5 stays ('retained'), and so do its columns and indexes. SQLite cannot
-- change a CHECK constraint in place, so the table is rebuilt with the 12-step procedure of
-- https://sqlite.org/lang_altertable.html#otheralter: new table, copy, drop, rename,
-- indexes again, all inside this step's transaction. No foreign key refers to this table
-- and foreign_keys is still off while steps run (Inbox::open sets it afterwards).
CREATE TABLE inbox_dead_letters_v7 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'invalid_payload', 'handler_failed',
                          'handler_crashed', 'retained', 'handler_reentered')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    -- 'dead' -> 'requeued' (admin tool) -> 'replayed' (the running Consumer committed it)
    -- or 'dead' again (it failed again); 'dead' -> 'replayed' by a direct replay.
    status            TEXT    NOT NULL DEFAULT 'dead'
                          CHECK (status IN ('dead', 'requeued', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v7 (id, consumer_name, message_id, topic, payload, payload_size,
    properties, qos, reason, reason_text, attempts, first_attempt_at, last_attempt_at,
    dead_lettered_at, redeliveries, status, replayed_at, retention_at)
  SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,
         reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,
         redeliveries, status, replayed_at, retention_at
    FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v7 RENAME TO inbox_dead_letters;
CREATE INDEX inbox_dead_letters_by_id ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX inbox_dead_letters_by_time ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX inbox_dead_letters_retention ON inbox_dead_letters (retention_at);
-- What a running Consumer polls for: nearly always empty, so the poll is one index probe.
CREATE INDEX inbox_dead_letters_requeued ON inbox_dead_letters (consumer_name, id)
    WHERE status = 'requeued';

PRAGMA user_version = 7;

-- @version 8
-- Transactional outbox: messages to publish, enqueued inside the transaction that makes
-- them true (a handler's claim, or the application's own), and published by the relay
-- until the broker's PUBACK. message_id is the stable producer-assigned id sent with
-- every (re)publish, so the next hop's inbox drops resends. seq is AUTOINCREMENT so a
-- pruned or dropped last row's number is never reused: the relay reads rows past the
-- last seq it took, and commit order is seq order (SQLite has one writer).
CREATE TABLE IF NOT EXISTS outbox_messages (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id    TEXT    NOT NULL UNIQUE,
    ordering_key  TEXT    NOT NULL,           -- FIFO per key; default the topic
    class         TEXT    NOT NULL,           -- topic prefix of the bounding class, '' none
    topic         TEXT    NOT NULL,
    payload       BLOB    NOT NULL,
    properties    TEXT    NOT NULL,           -- MQTT 5 properties as a JSON object
    qos           INTEGER NOT NULL DEFAULT 1,
    size_bytes    INTEGER NOT NULL,           -- counted against the class's byte bound
    enqueued_at   INTEGER NOT NULL,           -- wall clock, ms
    enqueued_clock INTEGER NOT NULL DEFAULT 0, -- retention clock, ms: what max_age_ms counts
    state         TEXT    NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0, -- publishes handed to the client
    sent_at       INTEGER,                    -- wall clock, ms: PUBACK seen
    dead_reason   TEXT CHECK (dead_reason IN ('rejected_by_broker', 'expired',
                                              'payload_too_large')),
    reason_code   INTEGER,                    -- MQTT 5 PUBACK reason code, if any
    reason_text   TEXT,
    dead_at       INTEGER,                    -- wall clock, ms
    -- Retention clock (README "Clock safety"), ms, when the row became sent or dead: the
    -- Pruner deletes sent rows past RetentionOptions::window and dead rows past
    -- dead_letter_window by it, so a wall-clock jump never ages a row early.
    retention_at  INTEGER
);
-- Partial, one per state, so each row is in one index at a time, and each query's
-- `state = '...'` term matches an index's own WHERE (SQLite uses a partial index only
-- then: https://sqlite.org/partialindex.html). The relay reads pending rows in seq order;
-- the Pruner walks sent and dead rows by retention_at. (One index on (state, seq) made
-- the planner read every sent row and sort them for each Pruner batch.)
CREATE INDEX IF NOT EXISTS outbox_messages_pending
    ON outbox_messages (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_messages_sent_retention
    ON outbox_messages (retention_at) WHERE state = 'sent';
CREATE INDEX IF NOT EXISTS outbox_messages_dead_retention
    ON outbox_messages (retention_at) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS outbox_messages_class
    ON outbox_messages (class, seq) WHERE state = 'pending';

-- Pending rows and bytes per class, kept by triggers so that every path (enqueue, the
-- relay's marks, drops, purges) keeps the bounds' view exact without a scan.
CREATE TABLE IF NOT EXISTS outbox_usage (
    class   TEXT    PRIMARY KEY,
    rows    INTEGER NOT NULL DEFAULT 0,
    bytes   INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0        -- rows removed by drop_oldest, ever
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS outbox_usage_insert AFTER INSERT ON outbox_messages
WHEN NEW.state = 'pending' BEGIN
    INSERT INTO outbox_usage (class, rows, bytes) VALUES (NEW.class, 1, NEW.size_bytes)
    ON CONFLICT (class) DO UPDATE SET rows = rows + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS outbox_usage_leave AFTER UPDATE OF state ON outbox_messages
WHEN OLD.state = 'pending' AND NEW.state <> 'pending' BEGIN
    UPDATE outbox_usage SET rows = rows - 1, bytes = bytes - OLD.size_bytes
    WHERE class = OLD.class;
END;
CREATE TRIGGER IF NOT EXISTS outbox_usage_return AFTER UPDATE OF state ON outbox_messages
WHEN OLD.state <> 'pending' AND NEW.state = 'pending' BEGIN
    INSERT INTO outbox_usage (class, rows, bytes) VALUES (NEW.class, 1, NEW.size_bytes)
    ON CONFLICT (class) DO UPDATE SET rows = rows + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS outbox_usage_delete AFTER DELETE ON outbox_messages
WHEN OLD.state = 'pending' BEGIN
    UPDATE outbox_usage SET rows = rows - 1, bytes = bytes - OLD.size_bytes
    WHERE class = OLD.class;
END;

PRAGMA user_version = 8;

-- @version 9
-- Dead letters get the reason 'outbox_full': a handler's enqueue met a full kReject outbox
-- class. That is backpressure, not a failure of the message, and the Consumer cannot wait
-- for room inside the PUBLISH callback (the relay's PUBACKs arrive on that same Paho
-- thread), so it parks the message here as 'requeued', committed before the PUBACK, and
-- its requeue thread replays it once the relay has made room. The table is rebuilt as in
-- step 7 (SQLite cannot change a CHECK constraint in place); every column, row and index
-- stays as it was.
CREATE TABLE inbox_dead_letters_v9 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'invalid_payload', 'handler_failed',
                          'handler_crashed', 'retained', 'handler_reentered',
                          'outbox_full')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    -- 'dead' -> 'requeued' (admin tool) -> 'replayed' (the running Consumer committed it)
    -- or 'dead' again (it failed again); 'dead' -> 'replayed' by a direct replay. A message
    -- parked by a full outbox starts 'requeued' and is 'requeued' again while it stays full.
    status            TEXT    NOT NULL DEFAULT 'dead'
                          CHECK (status IN ('dead', 'requeued', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v9 (id, consumer_name, message_id, topic, payload, payload_size,
    properties, qos, reason, reason_text, attempts, first_attempt_at, last_attempt_at,
    dead_lettered_at, redeliveries, status, replayed_at, retention_at)
  SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,
         reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,
         redeliveries, status, replayed_at, retention_at
    FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v9 RENAME TO inbox_dead_letters;
CREATE INDEX inbox_dead_letters_by_id ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX inbox_dead_letters_by_time ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX inbox_dead_letters_retention ON inbox_dead_letters (retention_at);
CREATE INDEX inbox_dead_letters_requeued ON inbox_dead_letters (consumer_name, id)
    WHERE status = 'requeued';

PRAGMA user_version = 9;

-- @version 10
-- Dead letters get the reason 'outbox_refused' (issue 27): the handler's
-- Outbox::enqueue_or_throw refused its outgoing message for a reason no retry can change
-- (an id too long or malformed, a topic or property MQTT does not allow, a message larger
-- than its class), so the input is dead-lettered at once instead of being retried up to
-- max_attempts. The table is rebuilt as in step 7 (SQLite cannot change a CHECK
-- constraint in place); every column, row and index stays as it was.
CREATE TABLE inbox_dead_letters_v10 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'invalid_payload', 'handler_failed',
                          'handler_crashed', 'retained', 'handler_reentered',
                          'outbox_full', 'outbox_refused')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    -- 'dead' -> 'requeued' (admin tool) -> 'replayed' (the running Consumer committed it)
    -- or 'dead' again (it failed again); 'dead' -> 'replayed' by a direct replay. A message
    -- parked by a full outbox starts 'requeued' and is 'requeued' again while it stays full.
    status            TEXT    NOT NULL DEFAULT 'dead'
                          CHECK (status IN ('dead', 'requeued', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v10 (id, consumer_name, message_id, topic, payload, payload_size,
    properties, qos, reason, reason_text, attempts, first_attempt_at, last_attempt_at,
    dead_lettered_at, redeliveries, status, replayed_at, retention_at)
  SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,
         reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,
         redeliveries, status, replayed_at, retention_at
    FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v10 RENAME TO inbox_dead_letters;
CREATE INDEX inbox_dead_letters_by_id ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX inbox_dead_letters_by_time ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX inbox_dead_letters_retention ON inbox_dead_letters (retention_at);
CREATE INDEX inbox_dead_letters_requeued ON inbox_dead_letters (consumer_name, id)
    WHERE status = 'requeued';

PRAGMA user_version = 10;

-- @version 11
-- Store-then-process claims are fenced by a token instead of being timed by the wall
-- clock. Each claim of a row adds one to claim_token, and every write a worker makes to
-- its row (done, failed, dead, released) requires the token it claimed with: a worker
-- whose claim was returned to 'pending' (reaped) can never commit over the claim that
-- followed, in this process or in another, before or after a restart. Leases are timed on
-- each process's monotonic clock, in memory (docs/store-then-process.md "The reaper"), so
-- claimed_at (wall clock) is for people only. From this version on next_attempt_at is on
-- the retention clock; a value further ahead than the retry backoff's maximum (a wall-clock
-- stamp of an older release, or another process's clock) counts as due.
ALTER TABLE inbox_messages ADD COLUMN claim_token INTEGER NOT NULL DEFAULT 0;

PRAGMA user_version = 11;

-- @version 12
-- Outbox dead letters get the reason 'connection_dropped' (issue 27): a row after whose
-- publish the broker closed the connection every time it was the oldest in flight, as
-- mosquitto does with a PUBLISH over its max_packet_size on MQTT 3.1.1, which cannot
-- announce the limit. The table is rebuilt as in step 7 (SQLite cannot change a CHECK
-- constraint in place): same columns in the same order, same rows and seqs, the same
-- indexes and triggers (DROP TABLE drops them). Its AUTOINCREMENT counter is carried over
-- (sqlite_sequence), so a seq of a pruned last row is still never reused.
CREATE TABLE outbox_messages_v12 (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id    TEXT    NOT NULL UNIQUE,
    ordering_key  TEXT    NOT NULL,           -- FIFO per key; default the topic
    class         TEXT    NOT NULL,           -- topic prefix of the bounding class, '' none
    topic         TEXT    NOT NULL,
    payload       BLOB    NOT NULL,
    properties    TEXT    NOT NULL,           -- MQTT 5 properties as a JSON object
    qos           INTEGER NOT NULL DEFAULT 1,
    size_bytes    INTEGER NOT NULL,           -- counted against the class's byte bound
    enqueued_at   INTEGER NOT NULL,           -- wall clock, ms
    enqueued_clock INTEGER NOT NULL DEFAULT 0, -- retention clock, ms: what max_age_ms counts
    state         TEXT    NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0, -- publishes handed to the client
    sent_at       INTEGER,                    -- wall clock, ms: PUBACK seen
    dead_reason   TEXT CHECK (dead_reason IN ('rejected_by_broker', 'expired',
                                              'payload_too_large', 'connection_dropped')),
    reason_code   INTEGER,                    -- MQTT 5 PUBACK reason code, if any
    reason_text   TEXT,
    dead_at       INTEGER,                    -- wall clock, ms
    retention_at  INTEGER                     -- retention clock, ms: sent or dead since
);
INSERT INTO outbox_messages_v12 (seq, message_id, ordering_key, class, topic, payload,
    properties, qos, size_bytes, enqueued_at, enqueued_clock, state, attempts, sent_at,
    dead_reason, reason_code, reason_text, dead_at, retention_at)
  SELECT seq, message_id, ordering_key, class, topic, payload, properties, qos, size_bytes,
         enqueued_at, enqueued_clock, state, attempts, sent_at, dead_reason, reason_code,
         reason_text, dead_at, retention_at
    FROM outbox_messages;
-- The counter as it was: the insert above set it only to the largest seq still present,
-- or left none if no row is.
UPDATE sqlite_sequence
   SET seq = (SELECT seq FROM sqlite_sequence WHERE name = 'outbox_messages')
 WHERE name = 'outbox_messages_v12'
   AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox_messages');
INSERT INTO sqlite_sequence (name, seq)
  SELECT 'outbox_messages_v12', seq FROM sqlite_sequence
   WHERE name = 'outbox_messages'
     AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox_messages_v12');
DROP TABLE outbox_messages;
ALTER TABLE outbox_messages_v12 RENAME TO outbox_messages;
CREATE INDEX outbox_messages_pending ON outbox_messages (seq) WHERE state = 'pending';
CREATE INDEX outbox_messages_sent_retention
    ON outbox_messages (retention_at) WHERE state = 'sent';
CREATE INDEX outbox_messages_dead_retention
    ON outbox_messages (retention_at) WHERE state = 'dead';
CREATE INDEX outbox_messages_class ON outbox_messages (class, seq) WHERE state = 'pending';
CREATE TRIGGER outbox_usage_insert AFTER INSERT ON outbox_messages
WHEN NEW.state = 'pending' BEGIN
    INSERT INTO outbox_usage (class, rows, bytes) VALUES (NEW.class, 1, NEW.size_bytes)
    ON CONFLICT (class) DO UPDATE SET rows = rows + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER outbox_usage_leave AFTER UPDATE OF state ON outbox_messages
WHEN OLD.state = 'pending' AND NEW.state <> 'pending' BEGIN
    UPDATE outbox_usage SET rows = rows - 1, bytes = bytes - OLD.size_bytes
    WHERE class = OLD.class;
END;
CREATE TRIGGER outbox_usage_return AFTER UPDATE OF state ON outbox_messages
WHEN OLD.state <> 'pending' AND NEW.state = 'pending' BEGIN
    INSERT INTO outbox_usage (class, rows, bytes) VALUES (NEW.class, 1, NEW.size_bytes)
    ON CONFLICT (class) DO UPDATE SET rows = rows + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER outbox_usage_delete AFTER DELETE ON outbox_messages
WHEN OLD.state = 'pending' BEGIN
    UPDATE outbox_usage SET rows = rows - 1, bytes = bytes - OLD.size_bytes
    WHERE class = OLD.class;
END;

PRAGMA user_version = 12;

-- @version 13
-- A session the broker lost is recorded where the session is (issue 27's follow-up): per
-- client id, how many times a CONNACK came without a session although this record held
-- topic filters (SessionRecords::note_lost, subscriber.h), and when the last time was
-- (wall clock, ms; NULL never). The count lived only in the memory of the process that
-- saw it, so after a restart neither `mqtt-inbox stats` nor anyone else could tell that
-- queued messages had been lost. ADD COLUMN keeps every row; the old ones start at 0.
ALTER TABLE inbox_sessions ADD COLUMN sessions_lost INTEGER NOT NULL DEFAULT 0
    CHECK (sessions_lost >= 0);
ALTER TABLE inbox_sessions ADD COLUMN last_lost_at INTEGER;

PRAGMA user_version = 13;

-- @version 14
-- Dead letters get the reason 'handler_ended_transaction' (issue 39): a handler that ends
-- the library's transaction or tries to (COMMIT, ROLLBACK, BEGIN, commit() or abort() on the
-- transaction object, closing the connection) is refused on every store alike, nothing of
-- it commits, and its message is dead-lettered at once with the text naming what it ran,
-- instead of being retried up to max_attempts as handler_failed. The table is rebuilt as in
-- step 7 (SQLite cannot change a CHECK constraint in place); every column, row and index
-- stays as it was.
CREATE TABLE inbox_dead_letters_v14 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'invalid_payload', 'handler_failed',
                          'handler_crashed', 'retained', 'handler_reentered',
                          'outbox_full', 'outbox_refused',
                          'handler_ended_transaction')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    -- 'dead' -> 'requeued' (admin tool) -> 'replayed' (the running Consumer committed it)
    -- or 'dead' again (it failed again); 'dead' -> 'replayed' by a direct replay. A message
    -- parked by a full outbox starts 'requeued' and is 'requeued' again while it stays full.
    status            TEXT    NOT NULL DEFAULT 'dead'
                          CHECK (status IN ('dead', 'requeued', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v14 (id, consumer_name, message_id, topic, payload, payload_size,
    properties, qos, reason, reason_text, attempts, first_attempt_at, last_attempt_at,
    dead_lettered_at, redeliveries, status, replayed_at, retention_at)
  SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,
         reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,
         redeliveries, status, replayed_at, retention_at
    FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v14 RENAME TO inbox_dead_letters;
CREATE INDEX inbox_dead_letters_by_id ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX inbox_dead_letters_by_time ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX inbox_dead_letters_retention ON inbox_dead_letters (retention_at);
CREATE INDEX inbox_dead_letters_requeued ON inbox_dead_letters (consumer_name, id)
    WHERE status = 'requeued';

PRAGMA user_version = 14;

-- @version 15
-- A message's lifetime (issue 42). Dead letters get the reasons 'expired' (a message whose
-- MQTT 5 message expiry ran out before it could be applied: ConsumerOptions::expired) and
-- 'dependency_unavailable' (a handler that said "not yet", RetryLater, until its
-- dependency schedule was over); the table is rebuilt as in step 14, every column, row and
-- index kept.
CREATE TABLE inbox_dead_letters_v15 (
    id                INTEGER PRIMARY KEY,
    consumer_name     TEXT    NOT NULL,
    message_id        TEXT,              -- NULL when the message had no usable id
    topic             TEXT    NOT NULL,
    payload           BLOB    NOT NULL,
    payload_size      INTEGER NOT NULL,  -- bytes received; > length(payload) if cut
    properties        TEXT,              -- MQTT 5 properties as a JSON object
    qos               INTEGER NOT NULL,
    reason            TEXT    NOT NULL CHECK (reason IN (
                          'missing_id', 'invalid_id', 'payload_too_large',
                          'undecodable_payload', 'invalid_payload', 'handler_failed',
                          'handler_crashed', 'retained', 'handler_reentered',
                          'outbox_full', 'outbox_refused',
                          'handler_ended_transaction', 'expired',
                          'dependency_unavailable')),
    reason_text       TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER NOT NULL,
    last_attempt_at   INTEGER NOT NULL,
    dead_lettered_at  INTEGER NOT NULL,
    redeliveries      INTEGER NOT NULL DEFAULT 0,  -- deliveries seen after dead-lettering
    -- 'dead' -> 'requeued' (admin tool) -> 'replayed' (the running Consumer committed it)
    -- or 'dead' again (it failed again); 'dead' -> 'replayed' by a direct replay. A message
    -- parked by a full outbox starts 'requeued' and is 'requeued' again while it stays full.
    status            TEXT    NOT NULL DEFAULT 'dead'
                          CHECK (status IN ('dead', 'requeued', 'replayed')),
    replayed_at       INTEGER,
    retention_at      INTEGER            -- retention clock, ms
);
INSERT INTO inbox_dead_letters_v15 (id, consumer_name, message_id, topic, payload, payload_size,
    properties, qos, reason, reason_text, attempts, first_attempt_at, last_attempt_at,
    dead_lettered_at, redeliveries, status, replayed_at, retention_at)
  SELECT id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,
         reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,
         redeliveries, status, replayed_at, retention_at
    FROM inbox_dead_letters;
DROP TABLE inbox_dead_letters;
ALTER TABLE inbox_dead_letters_v15 RENAME TO inbox_dead_letters;
CREATE INDEX inbox_dead_letters_by_id ON inbox_dead_letters (consumer_name, message_id);
CREATE INDEX inbox_dead_letters_by_time ON inbox_dead_letters (dead_lettered_at);
CREATE INDEX inbox_dead_letters_retention ON inbox_dead_letters (retention_at);
CREATE INDEX inbox_dead_letters_requeued ON inbox_dead_letters (consumer_name, id)
    WHERE status = 'requeued';
-- Store-then-process rows keep their lifetime (issue 42). expires_at: the message's expiry
-- deadline on the retention clock (when the library received it plus the MQTT 5 message
-- expiry interval it arrived with, which the properties keep), NULL without one; a worker
-- dead-letters a row past it as 'expired' instead of applying it. not_yet and
-- waiting_since: the runs in a row whose handler said "not yet" (RetryLater) and when the
-- first of them was (retention clock, ms; NULL when not_yet is 0), so the dependency
-- schedule survives the row's claims and a restart. ADD COLUMN keeps every row.
ALTER TABLE inbox_messages ADD COLUMN expires_at INTEGER;
ALTER TABLE inbox_messages ADD COLUMN not_yet INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox_messages ADD COLUMN waiting_since INTEGER;

PRAGMA user_version = 15;
