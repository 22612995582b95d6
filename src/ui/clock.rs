//! Wall-clock labels (`HH:MM:SS`, local time) for messages and the trim/eviction log,
//! and the chat list's dates.

use std::time::{SystemTime, UNIX_EPOCH};

/// The local time now as `HH:MM:SS`.
pub fn now_label() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (h, m, s) = local_hms(secs as i64);
    format!("{h:02}:{m:02}:{s:02}")
}

const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// When a chat was last used (`ms` since the epoch): `HH:MM` today, else `Nov 30`.
pub fn date_label(ms: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let then = (ms / 1000) as i64;
    let (day, month, h, m) = local_day_month_hm(then);
    if local_day_month_hm(now).0 == day && (now - then).abs() < 86_400 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{} {day}", MONTHS[month.clamp(0, 11) as usize])
    }
}

/// (day of month, month 0–11, hour, minute) in local time.
#[cfg(unix)]
fn local_day_month_hm(secs: i64) -> (i32, i32, i32, i32) {
    let t = secs as libc::time_t;
    // SAFETY: as in `local_hms`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm).is_null() } {
        return (1, 0, 0, 0);
    }
    (tm.tm_mday, tm.tm_mon, tm.tm_hour, tm.tm_min)
}

#[cfg(not(unix))]
fn local_day_month_hm(secs: i64) -> (i32, i32, i32, i32) {
    let (h, m, _) = utc_hms(secs);
    (1, 0, h, m)
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
