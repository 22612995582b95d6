//! Wall-clock labels (`HH:MM:SS`, local time) for messages and the trim/eviction log.

use std::time::{SystemTime, UNIX_EPOCH};

/// The local time now as `HH:MM:SS`.
pub fn now_label() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (h, m, s) = local_hms(secs as i64);
    format!("{h:02}:{m:02}:{s:02}")
}

#[cfg(unix)]
fn local_hms(secs: i64) -> (i32, i32, i32) {
    let t = secs as libc::time_t;
    // SAFETY: `localtime_r` only writes into the `tm` we own; a null return leaves it zeroed.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if ok {
        (tm.tm_hour, tm.tm_min, tm.tm_sec)
    } else {
        utc_hms(secs)
    }
}

#[cfg(not(unix))]
fn local_hms(secs: i64) -> (i32, i32, i32) {
    utc_hms(secs)
}

fn utc_hms(secs: i64) -> (i32, i32, i32) {
    let day = secs.rem_euclid(86_400) as i32;
    (day / 3600, day / 60 % 60, day % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_shape() {
        let l = super::now_label();
        assert_eq!(l.len(), 8, "{l}");
        assert_eq!(&l[2..3], ":");
        assert_eq!(super::utc_hms(3661), (1, 1, 1));
    }
}
