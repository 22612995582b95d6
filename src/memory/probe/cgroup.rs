//! Linux control-group memory limits: the ceiling a container or systemd slice puts on
//! us, which can be far below the machine's `MemTotal`, and how much of it is left.
//!
//! Where the limit lives depends on the cgroup version and on how the hierarchy is
//! mounted, so we follow what the kernel tells us rather than guess one path:
//!
//! 1. `/proc/self/mountinfo` names the mount point (and the mounted root) of the
//!    `cgroup2` hierarchy and of the v1 hierarchy that carries the `memory` controller.
//! 2. `/proc/self/cgroup` names our cgroup in each (`0::/path` for v2,
//!    `N:memory:/path` for v1).
//! 3. Limits are hierarchical, so we read our cgroup and every ancestor up to the mount
//!    point and keep the tightest one: v2 `memory.max` ("max" means none) and
//!    `memory.current`; v1 `memory.limit_in_bytes` (a huge number means none) and
//!    `memory.usage_in_bytes`.
//!
//! Usage counts reclaimable page cache, which the kernel drops before it kills anyone,
//! so headroom adds back `inactive_file` from `memory.stat` (the same correction
//! `docker stats` makes).

use std::path::{Path, PathBuf};

use super::kv_text::space_field;
use crate::memory::files::FileSource;

/// Values at or above this are "no limit" (cgroup v1 reports `PAGE_COUNTER_MAX` pages,
/// e.g. 9223372036854771712, instead of a word).
const UNLIMITED_FROM: u64 = 1 << 60;

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// The cgroup path that is mounted (`/` unless the mount shows a sub-tree).
    pub root: String,
    /// Where it is mounted.
    pub point: PathBuf,
}

/// The hierarchies that can carry a memory limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CgroupMounts {
    pub v2: Option<CgroupMount>,
    pub v1_memory: Option<CgroupMount>,
}

impl CgroupMounts {
    /// The usual layout, used when `/proc/self/mountinfo` cannot be read.
    fn conventional() -> CgroupMounts {
        CgroupMounts {
            v2: Some(CgroupMount { root: "/".into(), point: "/sys/fs/cgroup".into() }),
            v1_memory: Some(CgroupMount { root: "/".into(), point: "/sys/fs/cgroup/memory".into() }),
        }
    }
}

/// Our cgroup paths, from `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CgroupMembership {
    pub v2: Option<String>,
    pub v1_memory: Option<String>,
}

/// A parsed limit file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Unlimited,
    Bytes(u64),
}

/// What the cgroups allow us, combined over both versions and all ancestors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CgroupMemory {
    /// The tightest limit, if any cgroup sets one.
    pub limit_bytes: Option<u64>,
    /// The smallest `limit − (usage − inactive_file)` over the limited cgroups.
    pub headroom_bytes: Option<u64>,
}

/// Parses `/proc/self/mountinfo`:
/// `id parent maj:min root mountpoint opts [optional…] - fstype source superopts`.
pub(crate) fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut mounts = CgroupMounts::default();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first()) else {
            continue;
        };
        let mount = CgroupMount { root: unescape_octal(root), point: unescape_octal(point).into() };
        match *fstype {
            "cgroup2" if mounts.v2.is_none() => mounts.v2 = Some(mount),
            "cgroup" if mounts.v1_memory.is_none() => {
                let superopts = right.get(2).copied().unwrap_or("");
                if superopts.split(',').any(|o| o == "memory") {
                    mounts.v1_memory = Some(mount);
                }
            }
            _ => {}
        }
    }
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match escaped {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/self/cgroup`: `hierarchy-id:controllers:path` per line.
pub(crate) fn parse_membership(text: &str) -> CgroupMembership {
    let mut m = CgroupMembership::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            m.v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            m.v1_memory = Some(path.to_string());
        }
    }
    m
}

/// Parses a limit file: `max` (v2), a number of bytes, or a huge number (v1 "none").
pub(crate) fn parse_limit(text: &str) -> Option<Limit> {
    let t = text.trim();
    if t == "max" {
        return Some(Limit::Unlimited);
    }
    let v: u64 = t.parse().ok()?;
    Some(if v >= UNLIMITED_FROM { Limit::Unlimited } else { Limit::Bytes(v) })
}

/// The directory of our cgroup under a mount. When the mount shows a sub-tree (as in
/// containers without a cgroup namespace), the mounted root is stripped from our path;
/// when our path is not under it at all, the mount point itself is the best guess.
pub(crate) fn cgroup_dir(mount: &CgroupMount, path: &str) -> PathBuf {
    let root = mount.root.trim_end_matches('/');
    let rel = if root.is_empty() {
        Some(path)
    } else if path == root {
        Some("")
    } else {
        path.strip_prefix(root).filter(|rest| rest.starts_with('/'))
    };
    match rel {
        Some(rel) => {
            let rel = rel.trim_start_matches('/');
            // A path that climbs out (`..`) is not something we follow.
            if rel.split('/').any(|c| c == "..") {
                mount.point.clone()
            } else {
                mount.point.join(rel)
            }
        }
        None => mount.point.clone(),
    }
}

/// File names of one cgroup version.
struct Files {
    limit: &'static str,
    usage: &'static str,
    inactive_file_key: &'static str,
}

const V2: Files = Files { limit: "memory.max", usage: "memory.current", inactive_file_key: "inactive_file" };
const V1: Files =
    Files { limit: "memory.limit_in_bytes", usage: "memory.usage_in_bytes", inactive_file_key: "total_inactive_file" };

/// Reads limits and usage at `dir` and each ancestor up to `top`, folding them into `acc`.
fn fold_hierarchy(fs: &dyn FileSource, dir: &Path, top: &Path, names: &Files, acc: &mut CgroupMemory) {
    let mut current = Some(dir);
    while let Some(d) = current {
        if let Some(Limit::Bytes(limit)) = fs.read(&d.join(names.limit)).as_deref().and_then(parse_limit) {
            acc.limit_bytes = Some(acc.limit_bytes.map_or(limit, |l| l.min(limit)));
            if let Some(usage) = fs.read(&d.join(names.usage)).and_then(|t| t.trim().parse::<u64>().ok()) {
                let reclaimable =
                    fs.read(&d.join("memory.stat")).and_then(|t| space_field(&t, names.inactive_file_key)).unwrap_or(0);
                let used = usage.saturating_sub(reclaimable);
                let headroom = limit.saturating_sub(used);
                acc.headroom_bytes = Some(acc.headroom_bytes.map_or(headroom, |h| h.min(headroom)));
            }
        }
        if d == top {
            break;
        }
        current = d.parent().filter(|p| p.starts_with(top));
    }
}

/// The memory limit and headroom our cgroups impose; both `None` outside any limit.
pub(crate) fn cgroup_memory(fs: &dyn FileSource) -> CgroupMemory {
    let mounts = fs
        .read(Path::new("/proc/self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_else(CgroupMounts::conventional);
    let Some(membership) = fs.read(Path::new("/proc/self/cgroup")).map(|t| parse_membership(&t)) else {
        return CgroupMemory::default();
    };
    let mut acc = CgroupMemory::default();
    for (mount, path, names) in [(&mounts.v2, &membership.v2, &V2), (&mounts.v1_memory, &membership.v1_memory, &V1)] {
        if let (Some(mount), Some(path)) = (mount, path) {
            let dir = cgroup_dir(mount, path);
            fold_hierarchy(fs, &dir, &mount.point, names, &mut acc);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::files::FakeFiles;
    use crate::memory::{GIB, MIB};

    /// A hybrid host like our build machine: v1 memory controller, v2 mounted aside.
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";

    const V2_MOUNTINFO: &str = "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn mountinfo_finds_both_hierarchies() {
        let m = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(m.v2.map(|m| m.point), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(m.v1_memory.map(|m| m.point), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        let m = parse_mountinfo(V2_MOUNTINFO);
        assert_eq!(m.v2.map(|m| m.point), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(m.v1_memory, None);
    }

    #[test]
    fn mountinfo_garbage_is_empty() {
        assert_eq!(parse_mountinfo("nonsense\n - \n1 2 3\n"), CgroupMounts::default());
    }

    #[test]
    fn mountinfo_unescapes_spaces() {
        let m = parse_mountinfo("1 2 0:1 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n");
        assert_eq!(m.v2.map(|m| m.point), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn membership_reads_v2_and_v1_memory() {
        let m = parse_membership(HYBRID_CGROUP);
        assert_eq!(m.v2.as_deref(), Some("/"));
        assert_eq!(m.v1_memory.as_deref(), Some("/process_api/abc"));
        let m = parse_membership("5:cpu,memory:/x\n");
        assert_eq!(m.v1_memory.as_deref(), Some("/x"));
        assert_eq!(parse_membership("garbage"), CgroupMembership::default());
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), Some(Limit::Unlimited));
        assert_eq!(parse_limit("9223372036854771712\n"), Some(Limit::Unlimited));
        assert_eq!(parse_limit("536870912\n"), Some(Limit::Bytes(512 * MIB)));
        assert_eq!(parse_limit("-1"), None);
        assert_eq!(parse_limit("lots"), None);
    }

    #[test]
    fn dir_strips_mounted_root() {
        let at_root = CgroupMount { root: "/".into(), point: "/sys/fs/cgroup".into() };
        assert_eq!(cgroup_dir(&at_root, "/user.slice/app"), PathBuf::from("/sys/fs/cgroup/user.slice/app"));
        assert_eq!(cgroup_dir(&at_root, "/"), PathBuf::from("/sys/fs/cgroup/"));
        let subtree = CgroupMount { root: "/docker/abc".into(), point: "/sys/fs/cgroup/memory".into() };
        assert_eq!(cgroup_dir(&subtree, "/docker/abc"), PathBuf::from("/sys/fs/cgroup/memory/"));
        assert_eq!(cgroup_dir(&subtree, "/docker/abc/x"), PathBuf::from("/sys/fs/cgroup/memory/x"));
        // Not under the mounted root ("/docker/abcdef" only shares a prefix).
        assert_eq!(cgroup_dir(&subtree, "/docker/abcdef"), PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(cgroup_dir(&at_root, "/../../etc"), PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn v2_limit_with_reclaimable_cache() {
        let fs = FakeFiles::new()
            .with("/proc/self/mountinfo", V2_MOUNTINFO)
            .with("/proc/self/cgroup", "0::/app.slice/chat\n")
            .with("/sys/fs/cgroup/app.slice/chat/memory.max", "1073741824\n")
            .with("/sys/fs/cgroup/app.slice/chat/memory.current", "805306368\n")
            .with("/sys/fs/cgroup/app.slice/chat/memory.stat", "anon 1\ninactive_file 268435456\n");
        let m = cgroup_memory(&fs);
        assert_eq!(m.limit_bytes, Some(GIB));
        // 1 GiB − (768 MiB − 256 MiB cache) = 512 MiB.
        assert_eq!(m.headroom_bytes, Some(512 * MIB));
    }

    #[test]
    fn tightest_ancestor_wins() {
        let fs = FakeFiles::new()
            .with("/proc/self/mountinfo", V2_MOUNTINFO)
            .with("/proc/self/cgroup", "0::/a/b\n")
            .with("/sys/fs/cgroup/a/b/memory.max", "max\n")
            .with("/sys/fs/cgroup/a/memory.max", "2147483648\n")
            .with("/sys/fs/cgroup/a/memory.current", "1073741824\n");
        let m = cgroup_memory(&fs);
        assert_eq!(m.limit_bytes, Some(2 * GIB));
        assert_eq!(m.headroom_bytes, Some(GIB));
    }

    #[test]
    fn hybrid_v1_unlimited_is_no_limit() {
        let fs = FakeFiles::new()
            .with("/proc/self/mountinfo", HYBRID_MOUNTINFO)
            .with("/proc/self/cgroup", HYBRID_CGROUP)
            .with("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n")
            .with("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(cgroup_memory(&fs), CgroupMemory::default());
    }

    #[test]
    fn hybrid_v1_limit() {
        let fs = FakeFiles::new()
            .with("/proc/self/mountinfo", HYBRID_MOUNTINFO)
            .with("/proc/self/cgroup", HYBRID_CGROUP)
            .with("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "536870912\n")
            .with("/sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", "garbage\n");
        let m = cgroup_memory(&fs);
        assert_eq!(m.limit_bytes, Some(512 * MIB));
        assert_eq!(m.headroom_bytes, None, "unreadable usage gives no headroom figure");
    }

    #[test]
    fn unreadable_mountinfo_falls_back_to_conventional_paths() {
        let fs = FakeFiles::new().with("/proc/self/cgroup", "0::/\n").with("/sys/fs/cgroup/memory.max", "1073741824\n");
        assert_eq!(cgroup_memory(&fs).limit_bytes, Some(GIB));
    }

    #[test]
    fn nothing_readable_is_no_limit() {
        assert_eq!(cgroup_memory(&FakeFiles::new()), CgroupMemory::default());
    }
}
