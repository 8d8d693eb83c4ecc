//! The server layout the agent learned for this binary, patched into
//! `.rodata` before load so the verifier sees constants.
use sqlbee_kernel_abi::ServerLayout;

#[unsafe(no_mangle)]
static LAYOUT: ServerLayout = ServerLayout {
    command_arg: 0,
    thd_arg: 1,
    packet_arg: 2,
    query_offset: 0,
    connection_id_offset: 0,
    text_limit: sqlbee_kernel_abi::DEFAULT_TEXT_LIMIT,
    long_wait_us: 0,
    command_offset: 0,
    start_utime_offset: 0,
    lock_utime_offset: 0,
    command_probe: 0,
    digest_slots: 0,
    wait_probes: 0,
    known_sets: 1,
    db_offset: sqlbee_kernel_abi::UNKNOWN,
    stats_base: 0,
    stats_len: 0,
    stats_fields: 0,
    stats_alone: 0,
    field_at: [0; sqlbee_kernel_abi::thd_field::COUNT],
    field_rel: [0; sqlbee_kernel_abi::thd_field::COUNT],
    task_runtime_offset: 0,
    task_btf: 0,
    sctx_offset: sqlbee_kernel_abi::UNKNOWN,
    sctx_user_offset: 0,
    sctx_host_offset: 0,
    reserved: 0,
    nested_probes: 0,
    spcont_offset: sqlbee_kernel_abi::UNKNOWN,
    rcontext_sp_offset: 0,
    sp_db_offset: 0,
    sp_name_offset: 0,
    sp_handler_offset: 0,
    sp_flags_offset: 0,
    handler_procedure: 0,
    handler_function: 0,
    handler_trigger: 0,
    long_statement_ms: 0,
    vio_offset: sqlbee_kernel_abi::UNKNOWN,
    apply_probes: 0,
    event_when_offset: 0,
    rows_type_offset: 0,
    rows_table_offset: 0,
    table_share_offset: 0,
    share_db_offset: 0,
    event_thd_offset: sqlbee_kernel_abi::UNKNOWN,
    row_counter_offsets: [0; 3],
    rows_vtables: [0; sqlbee_kernel_abi::ROWS_VTABLES],
    gtid_vtable: 0,
    rgi_rli_offset: sqlbee_kernel_abi::UNKNOWN,
    rli_mi_offset: sqlbee_kernel_abi::UNKNOWN,
    mi_channel_offset: sqlbee_kernel_abi::UNKNOWN,
    reserved_channel: 0,
    send_tgid: 0,
    task_fsbase_offset: 0,
    thd_tls_offset: 0,
    stmt_da_offset: 0,
    da_status_offset: 0,
    send_vio_offset: sqlbee_kernel_abi::UNKNOWN,
};

/// The layout, read where each field is used. Through a pointer the
/// compiler cannot trace back to `LAYOUT` (else it folds the default
/// values in); the verifier still reads every field as a constant, and no
/// copy of the whole struct takes the programs' stack.
#[inline(always)]
pub fn layout() -> &'static ServerLayout {
    // SAFETY: a pointer to a static, unchanged by the barrier.
    unsafe { &*core::hint::black_box(&raw const LAYOUT) }
}
