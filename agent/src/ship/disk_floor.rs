//! The free-space floor: the spool shares its filesystem with the database
//! more often than not, and a full disk stops mysqld. The spool never
//! writes past the point where less than the floor would be left free.
use std::{ffi::CString, io, os::unix::ffi::OsStrExt, path::Path};

/// Keep `percent` of the filesystem or `bytes`, whichever is less, free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskFloor {
    pub percent: u8,
    pub bytes: u64,
}

impl Default for DiskFloor {
    fn default() -> Self {
        Self { percent: 10, bytes: 1 << 30 }
    }
}

/// Size and free space of a filesystem, as an unprivileged user sees them.
#[derive(Clone, Copy, Debug)]
pub struct Space {
    pub total: u64,
    pub available: u64,
}

pub fn space(path: &Path) -> io::Result<Space> {
    let c_path =
        CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a zeroed out-parameter.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = stat.f_frsize as u64;
    Ok(Space { total: stat.f_blocks as u64 * unit, available: stat.f_bavail as u64 * unit })
}

impl DiskFloor {
    /// No floor: writes go on until the filesystem itself says it is full.
    pub fn is_off(&self) -> bool {
        self.percent == 0 || self.bytes == 0
    }

    pub fn floor_bytes(&self, total: u64) -> u64 {
        (total / 100 * self.percent as u64).min(self.bytes)
    }

    /// Bytes that may still be written to the filesystem holding `path`.
    pub fn room(&self, path: &Path) -> io::Result<u64> {
        let space = space(path)?;
        Ok(space.available.saturating_sub(self.floor_bytes(space.total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_smaller_of_the_share_and_the_bytes() {
        let floor = DiskFloor::default();
        assert_eq!(floor.floor_bytes(4 << 30), 429_496_720, "10% of 4 GiB is less than 1 GiB");
        assert_eq!(floor.floor_bytes(100 << 30), 1 << 30);
        assert_eq!(DiskFloor { percent: 0, bytes: 1 << 30 }.floor_bytes(100 << 30), 0);
        let room = floor.room(Path::new("/")).unwrap();
        let space = space(Path::new("/")).unwrap();
        assert!(room <= space.available && space.available <= space.total);
    }
}
