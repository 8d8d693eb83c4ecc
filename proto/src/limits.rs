// Included by build.rs as well as compiled into the crate, so that the
// generated decode bounds and the documentation take these numbers from
// one place. Plain data only: no `use`, no items but these constants.

/// Elements a repeated field may hold in one message, by `Message.field`.
/// A push past one is refused before it is decoded, naming the field. The
/// agent's own maxima are below each.
pub const COUNT_LIMITS: &[(&str, u64)] = &[
    // One window per instance a host runs, or several per instance when a
    // backlog is replayed; the agent never puts more than this in a batch.
    ("Batch.windows", 10_000),
    ("Batch.gaps", 10_000),
    ("Batch.agent_windows", 10_000),
    // The agent keeps at most --max-digests (at most 50,000) digests per
    // instance per window, plus one overflow row.
    ("InstanceWindow.digests", 50_001),
    ("InstanceWindow.commands", 256),
    ("InstanceWindow.lock_waits", 1_000),
    // The agent sends at most 1,000 plans per window.
    ("InstanceWindow.plans", 1_000),
    ("Plan.access", 1_024),
    ("TableAccess.key_parts", 64),
    ("TableAccess.possible_keys", 64),
    ("DigestStats.error_codes", 1_024),
    ("DigestStats.waits", 16),
    ("DigestStats.accounts", 64),
    ("DigestStats.clients", 64),
    ("DigestStats.tables", 256),
    // At most 16 keys (--query-tags), 32 values each.
    ("DigestStats.tags", 16),
    ("TagCount.values", 64),
    // Log-linear buckets: 8 per power of two over 64 bits.
    ("Histogram.buckets", 1_024),
    ("LockWait.blockers", 32),
    ("Blocker.statements", 8),
    ("AgentWindow.untraced", 1_000),
    ("HostMetrics.disks", 1_024),
    ("HostMetrics.interfaces", 1_024),
    ("SeriesRequest.by_digests", 1_000),
    // The agent reads at most 100,000 connections per server.
    ("ActivityReport.instances", 1_000),
    ("InstanceActivity.connections", 100_000),
    // The agent lists at most 1,000 per window.
    ("InstanceWindow.long_statements", 1_000),
    ("LongStatement.waits", 16),
    // The agent lists at most 1,000 per window, naming at most 16 objects
    // each.
    ("InstanceWindow.changes", 1_000),
    ("Change.objects", 64),
    // A server has about 700 variables.
    ("Change.values", 4_096),
    ("InstanceActivity.blocker_sources", 8),
    ("AnnotateRequest.instances", 256),
    // The agent follows at most 2,000 tables per server; a table has at
    // most 64 indexes of at most 16 parts (the agent keeps 128 and 64).
    ("InstanceWindow.table_indexes", 2_000),
    ("TableIndexes.indexes", 128),
    ("IndexDefinition.columns", 64),
    // Six classes of event; the agent names at most 2,000 tables per
    // window and counts the rest in one row.
    // MariaDB replicates from at most 64 primaries (channels) at once.
    ("InstanceWindow.replication", 64),
    ("Replication.classes", 16),
    ("Replication.tables", 2_001),
];

/// Bytes a string may hold, by `Message.field`.
pub const LENGTH_LIMITS: &[(&str, u64)] = &[
    ("AgentIdentity.agent_id", 128),
    ("AgentIdentity.host", 1_024),
    ("AgentIdentity.version", 1_024),
    // host:port, or a container's name (a pod name is up to 253) and
    // port: every page lists them.
    ("ServerInstance.name", 512),
    ("ServerInstance.container_id", 128),
    ("ServerInstance.container", 512),
    ("ServerInstance.build_id", 128),
    ("ServerInstance.server_version", 256),
    // The agent captures at most 16 KiB of a statement.
    ("DigestStats.digest_text", 65_536),
    ("DigestStats.sample", 65_536),
    ("DigestStats.schema", 1_024),
    // The agent keeps keys of at most 64 bytes and values of at most 128.
    ("TagCount.key", 64),
    ("TagValue.value", 256),
    ("TraceExemplar.trace_id", 32),
    ("TraceExemplar.span_id", 16),
    ("DigestStats.program", 1_024),
    ("DigestStats.program_kind", 32),
    ("DigestStats.source", 32),
    ("DigestStats.statement_kind", 64),
    ("TableUse.schema", 1_024),
    ("TableUse.table", 1_024),
    // The agent cuts a message at 256 bytes.
    ("ErrorCount.sample_message", 1_024),
    ("WaitStats.class", 32),
    ("AccountCount.user", 1_024),
    ("AccountCount.host", 1_024),
    ("ClientCount.address", 64),
    ("ClientCount.process", 1_024),
    ("ClientCount.container", 512),
    ("ClientCount.container_id", 128),
    ("ClientCount.pod", 512),
    ("ClientCount.namespace", 256),
    // The agent keeps 128 bytes of each (redacted as tag values are).
    ("ClientCount.program", 512),
    ("ClientCount.driver", 512),
    ("CommandCount.command", 1_024),
    ("LockWait.class", 32),
    ("LockWait.digest_text", 65_536),
    ("LockWait.sample", 65_536),
    ("LockWait.blocker_kind", 32),
    ("Blocker.statements", 65_536),
    ("UntracedServer.reason", 4_096),
    ("UntracedServer.kind", 1_024),
    ("Gap.reason", 1_024),
    ("InstanceWindow.server_login", 4_096),
    ("Plan.schema", 1_024),
    // The agent sends no plan longer than 256 KiB.
    ("Plan.plan_json", 262_144),
    ("Plan.not_explained", 4_096),
    ("TableIndexes.schema", 1_024),
    ("TableIndexes.table", 1_024),
    ("AppliedClass.class", 32),
    // The agent copies at most 71 bytes of each name.
    ("Replication.channel", 1_024),
    ("AppliedTable.schema", 1_024),
    ("AppliedTable.table", 1_024),
    ("AppliedTable.kind", 32),
    ("IndexDefinition.name", 1_024),
    ("IndexDefinition.type", 64),
    ("IndexColumn.name", 1_024),
    ("TableAccess.table", 1_024),
    ("TableAccess.type", 64),
    ("TableAccess.key", 1_024),
    ("TableAccess.key_parts", 1_024),
    ("TableAccess.possible_keys", 1_024),
    ("InstanceActivity.warning", 4_096),
    ("Change.kind", 32),
    ("Change.action", 256),
    ("Change.objects", 2_048),
    ("Change.digest_text", 65_536),
    ("Change.schema", 1_024),
    ("Change.user", 1_024),
    ("Change.host", 1_024),
    ("Change.program", 1_024),
    ("Change.sample", 65_536),
    // The agent keeps 1,024 bytes of a value.
    ("SettingValue.name", 1_024),
    ("SettingValue.old", 4_096),
    ("SettingValue.new", 4_096),
    ("LongStatement.digest_text", 65_536),
    ("LongStatement.schema", 1_024),
    ("LongStatement.user", 1_024),
    ("LongStatement.host", 1_024),
    ("LongStatement.sample", 65_536),
    ("LongStatement.outcome", 32),
    ("LongStatement.deadlock_with_digest_text", 65_536),
    ("LongStatement.deadlock_with_sample", 65_536),
    ("InstanceActivity.blocker_sources", 64),
    ("LiveConnection.user", 1_024),
    ("LiveConnection.host", 1_024),
    ("LiveConnection.schema", 1_024),
    ("LiveConnection.command", 64),
    ("LiveConnection.state", 256),
    // The agent keeps at most 4 KiB of a running statement.
    ("LiveConnection.digest_text", 8_192),
    ("LiveConnection.sample", 8_192),
    ("LiveConnection.wait", 32),
    ("LiveConnection.blocked_by_source", 64),
    // A marker is a line, as a deploy tool writes it.
    ("AnnotateRequest.text", 4_096),
    ("AnnotateRequest.instances", 512),
];

/// Estimated bytes the decoded form of one request may take: the sizes of
/// its structs and vectors plus the bytes of its strings. Four times the
/// collector's 32 MiB message limit.
pub const MAX_DECODED_REQUEST: u64 = 128 << 20;

/// The same for a message only clients decode (answers, up to 64 MiB).
pub const MAX_DECODED_ANSWER: u64 = 512 << 20;
