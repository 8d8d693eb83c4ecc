//! Names of `enum_server_command` values (MariaDB `include/mysql_com.h`).
use std::borrow::Cow;

const NAMES: [&str; 32] = [
    "COM_SLEEP",
    "COM_QUIT",
    "COM_INIT_DB",
    "COM_QUERY",
    "COM_FIELD_LIST",
    "COM_CREATE_DB",
    "COM_DROP_DB",
    "COM_REFRESH",
    "COM_SHUTDOWN",
    "COM_STATISTICS",
    "COM_PROCESS_INFO",
    "COM_CONNECT",
    "COM_PROCESS_KILL",
    "COM_DEBUG",
    "COM_PING",
    "COM_TIME",
    "COM_DELAYED_INSERT",
    "COM_CHANGE_USER",
    "COM_BINLOG_DUMP",
    "COM_TABLE_DUMP",
    "COM_CONNECT_OUT",
    "COM_REGISTER_SLAVE",
    "COM_STMT_PREPARE",
    "COM_STMT_EXECUTE",
    "COM_STMT_SEND_LONG_DATA",
    "COM_STMT_CLOSE",
    "COM_STMT_RESET",
    "COM_SET_OPTION",
    "COM_STMT_FETCH",
    "COM_DAEMON",
    "COM_UNIMPLEMENTED",
    "COM_RESET_CONNECTION",
];

pub const COM_QUERY: u32 = 3;
pub const COM_STMT_EXECUTE: u32 = 23;

pub fn command_name(command: u32) -> Cow<'static, str> {
    match command {
        c if (c as usize) < NAMES.len() => Cow::Borrowed(NAMES[c as usize]),
        250 => Cow::Borrowed("COM_STMT_BULK_EXECUTE"),
        251 => Cow::Borrowed("COM_SLAVE_WORKER"),
        252 => Cow::Borrowed("COM_SLAVE_IO"),
        253 => Cow::Borrowed("COM_SLAVE_SQL"),
        c => Cow::Owned(format!("COM_{c}")),
    }
}
