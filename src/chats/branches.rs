//! A chat's other versions: where an edited message or a reply written again left the
//! earlier continuation. The record's `messages` stay the path shown (so readers that
//! know nothing of branches read the chat as it is shown); the other versions hang off
//! it as a tree ([`Fork`], [`Branch`]), stored flat in the record's `branches`:
//!
//! ```text
//!  "messages": [u0, a0, v1, b1]                       the path shown
//!  "branches": [
//!    { "at": 2, "version": 0, "messages": [u1, a1, u2, a2] },   #0: message 3, version 1
//!    { "from": 0, "at": 3, "version": 1, "messages": [a2'] } ]  #1: in #0, its message 4
//! ```
//!
//! Each stored branch replaces, from its message `at` on, the messages of the path it
//! forks from: `from` (an earlier stored branch) or, without it, the record's shown path.
//! The branches of one path and `at` are the versions of that message, each at its place
//! `version`; the one place none takes is the shown version's (so `[v1, b1]` above is
//! version 2 of message 3, and `u1…` version 1). A new version goes last. Flat, so that a
//! chat edited many times over is never nested deeper than a JSON reader allows.
//!
//! Records are hostile input: a branch that forks from a later one, a place taken twice
//! or out of range, more than [`MAX_BRANCHES`] branches ([`stored`]), a fork past the end
//! of its path, a version of another role than the message it stands for, an empty one or
//! a `system` message ([`check_forks`]) make the record unreadable.

use serde::{Deserialize, Serialize};

use super::ChatRecord;
use crate::transcript::{Message, Role};

/// The versions of the messages from one message on.
#[derive(Debug, Clone, PartialEq)]
pub struct Fork {
    /// The message where the versions start to differ, in the path the fork hangs off.
    pub at: usize,
    /// The shown version's place among the versions (`0..=others.len()`).
    pub shown: usize,
    /// The versions not shown, in order.
    pub others: Vec<Branch>,
}

/// One version not shown: the messages from its fork's `at` on, and its own forks.
#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    pub messages: Vec<Message>,
    pub forks: Vec<Fork>,
}

/// A message of the shown path that has other versions: `shown + 1` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchPoint {
    /// The message's index in the chat's messages.
    pub index: usize,
    /// The shown version (from 0).
    pub shown: usize,
    pub count: usize,
}

/// At most this many versions not shown in one record. Past it an edit replaces the
/// message as before branches (the old continuation is not kept); the bound keeps a
/// record's tree shallow enough to walk, and a hostile one from costing more than that.
pub const MAX_BRANCHES: usize = 1024;

impl ChatRecord {
    /// The shown path's messages from `keep` on become `new`; the old ones stay as another
    /// version from the first message where they differ (none when `new` repeats them, nor
    /// once the chat holds [`MAX_BRANCHES`]). The new version is shown, last of them.
    pub fn replace_from(&mut self, keep: usize, new: Vec<Message>) {
        let keep = keep.min(self.messages.len());
        let same = self.messages[keep..].iter().zip(&new).take_while(|(a, b)| a == b).count();
        let at = keep + same;
        if at < self.messages.len() {
            let old = self.take_suffix(at);
            if count_branches(&self.forks) + count_branches(&old.forks) >= MAX_BRANCHES {
                tracing::warn!("“{}” holds {MAX_BRANCHES} versions: the replaced one is not kept", self.title);
            } else {
                match self.forks.iter_mut().find(|f| f.at == at) {
                    Some(fork) => {
                        fork.others.insert(fork.shown, old);
                        fork.shown = fork.others.len();
                    }
                    None => {
                        self.forks.push(Fork { at, shown: 1, others: vec![old] });
                        self.forks.sort_by_key(|f| f.at);
                    }
                }
            }
        }
        self.messages.extend(new.into_iter().skip(same));
    }

    /// Shows version `version` (from 0) of message `index`; the shown one becomes another.
    pub fn switch_version(&mut self, index: usize, version: usize) -> Result<(), String> {
        let Some(fork) = self.forks.iter().find(|f| f.at == index) else {
            return Err(format!("message {} has no other versions", index + 1));
        };
        let count = fork.others.len() + 1;
        if version >= count {
            return Err(format!("message {} has {count} versions, not {}", index + 1, version + 1));
        }
        if version == fork.shown {
            return Ok(());
        }
        let current = self.take_suffix(index);
        let fork = self.forks.iter_mut().find(|f| f.at == index).expect("kept: its `at` is not past `index`");
        fork.others.insert(fork.shown, current);
        let chosen = fork.others.remove(version);
        fork.shown = version;
        self.messages.extend(chosen.messages);
        self.forks.extend(chosen.forks.into_iter().map(|mut f| {
            f.at += index;
            f
        }));
        self.forks.sort_by_key(|f| f.at);
        Ok(())
    }

    /// The messages of the shown path that have other versions, in order.
    pub fn branch_points(&self) -> Vec<BranchPoint> {
        self.forks.iter().map(|f| BranchPoint { index: f.at, shown: f.shown, count: f.others.len() + 1 }).collect()
    }

    /// The shown path from message `at` on, with the forks after `at` (a fork at `at`
    /// itself stays: it holds the versions of that message).
    fn take_suffix(&mut self, at: usize) -> Branch {
        let messages = self.messages.split_off(at);
        let (after, kept): (Vec<Fork>, Vec<Fork>) =
            std::mem::take(&mut self.forks).into_iter().partition(|f| f.at > at);
        self.forks = kept;
        let forks = after
            .into_iter()
            .map(|mut f| {
                f.at -= at;
                f
            })
            .collect();
        Branch { messages, forks }
    }
}

/// Versions not shown in `forks` and below.
fn count_branches(forks: &[Fork]) -> usize {
    let mut stack: Vec<&Fork> = forks.iter().collect();
    let mut n = 0;
    while let Some(fork) = stack.pop() {
        n += fork.others.len();
        stack.extend(fork.others.iter().flat_map(|b| &b.forks));
    }
    n
}

/// Checks the forks hanging off `messages` (the record's, or a branch's), and theirs:
/// sorted by `at`, each at a message of the path, each version non-empty and starting with
/// a message of the role of the one it stands for, no `system` message anywhere. (The
/// places and the count are checked as the record is read, by [`stored`].)
pub fn check_forks(messages: &[Message], forks: &[Fork]) -> Result<(), String> {
    let mut stack = vec![(messages, forks)];
    while let Some((messages, forks)) = stack.pop() {
        for (i, fork) in forks.iter().enumerate() {
            let here = format!("a branch at message {}", fork.at + 1);
            let Some(original) = messages.get(fork.at) else {
                return Err(format!("{here}: its path has only {} messages", messages.len()));
            };
            if i > 0 && forks[i - 1].at >= fork.at {
                return Err(format!("{here}: branch points out of order"));
            }
            if fork.others.is_empty() || fork.shown > fork.others.len() {
                return Err(format!("{here}: version {} of {} shown", fork.shown + 1, fork.others.len() + 1));
            }
            for branch in &fork.others {
                match branch.messages.first() {
                    None => return Err(format!("{here}: a version is empty")),
                    Some(first) if first.role != original.role => {
                        return Err(format!(
                            "{here}: a version starts with a message of the role {} for one of the role {}",
                            role_name(first.role),
                            role_name(original.role)
                        ))
                    }
                    Some(_) => {}
                }
                if branch.messages.iter().any(|m| m.role == Role::System) {
                    return Err(format!("{here}: a version has a message of the role system"));
                }
                stack.push((&branch.messages, &branch.forks));
            }
        }
    }
    Ok(())
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// The record's forks as stored: flat (see the module doc).
pub mod stored {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Branch, Fork, MAX_BRANCHES};
    use crate::transcript::Message;

    #[derive(Serialize, Deserialize)]
    struct StoredBranch {
        /// The stored branch it forks from (earlier in the list); none: the shown path.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<usize>,
        at: usize,
        /// Its place among the versions of its message.
        version: usize,
        messages: Vec<Message>,
    }

    pub fn serialize<S: Serializer>(forks: &[Fork], serializer: S) -> Result<S::Ok, S::Error> {
        let mut out: Vec<StoredBranch> = Vec::new();
        // (the stored index of the path, its forks), parents before children.
        let mut stack: Vec<(Option<usize>, &[Fork])> = vec![(None, forks)];
        while let Some((from, forks)) = stack.pop() {
            for fork in forks {
                for (i, branch) in fork.others.iter().enumerate() {
                    let version = i + usize::from(i >= fork.shown);
                    out.push(StoredBranch { from, at: fork.at, version, messages: branch.messages.clone() });
                    stack.push((Some(out.len() - 1), &branch.forks));
                }
            }
        }
        out.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Fork>, D::Error> {
        let flat = Vec::<StoredBranch>::deserialize(deserializer)?;
        build(flat).map_err(serde::de::Error::custom)
    }

    /// The tree of stored branches, built from the last up (children come after their
    /// parent), without recursion.
    fn build(flat: Vec<StoredBranch>) -> Result<Vec<Fork>, String> {
        if flat.len() > MAX_BRANCHES {
            return Err(format!("{} branches, more than the {MAX_BRANCHES} a record may hold", flat.len()));
        }
        // Per stored branch (and, last, the shown path): its versions by (at, place).
        let mut children: Vec<Vec<(usize, usize, Branch)>> = (0..=flat.len()).map(|_| Vec::new()).collect();
        let root = flat.len();
        for (i, b) in flat.into_iter().enumerate().rev() {
            let parent = match b.from {
                Some(p) if p < i => p,
                Some(p) => return Err(format!("branch {} forks from branch {}, not an earlier one", i + 1, p + 1)),
                None => root,
            };
            let forks = forks_of(std::mem::take(&mut children[i])).map_err(|e| format!("in branch {}: {e}", i + 1))?;
            children[parent].push((b.at, b.version, Branch { messages: b.messages, forks }));
        }
        forks_of(std::mem::take(&mut children[root]))
    }

    /// Groups versions by message; each group's places must be distinct and leave one
    /// free for the shown version.
    fn forks_of(mut versions: Vec<(usize, usize, Branch)>) -> Result<Vec<Fork>, String> {
        versions.sort_by_key(|&(at, place, _)| (at, place));
        // Each fork, and whether the shown version's place was passed.
        let mut forks: Vec<(Fork, bool)> = Vec::new();
        for (at, place, branch) in versions {
            if forks.last().is_none_or(|(f, _)| f.at != at) {
                forks.push((Fork { at, shown: 0, others: Vec::new() }, false));
            }
            let (fork, passed) = forks.last_mut().expect("pushed above");
            let k = fork.others.len();
            if place == k + usize::from(*passed) {
                // In order.
            } else if !*passed && place == k + 1 {
                *passed = true;
                fork.shown = k;
            } else {
                return Err(format!("the versions of message {} have no place for the shown one", at + 1));
            }
            fork.others.push(branch);
        }
        Ok(forks
            .into_iter()
            .map(|(mut fork, passed)| {
                if !passed {
                    fork.shown = fork.others.len();
                }
                fork
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chats::UNTITLED;

    fn m(role: Role, text: &str) -> Message {
        Message::new(role, text)
    }

    fn record(messages: Vec<Message>) -> ChatRecord {
        ChatRecord {
            id: "x".into(),
            title: UNTITLED.into(),
            name: None,
            created: 0,
            updated: 0,
            tokens: 0,
            system_prompt: None,
            thinking: None,
            messages,
            forks: Vec::new(),
        }
    }

    fn turns(texts: &[&str]) -> Vec<Message> {
        texts.iter().enumerate().map(|(i, t)| m(if i % 2 == 0 { Role::User } else { Role::Assistant }, t)).collect()
    }

    fn texts(r: &ChatRecord) -> Vec<&str> {
        r.messages.iter().map(|m| m.content.as_str()).collect()
    }

    #[test]
    fn editing_an_earlier_message_keeps_the_old_continuation_as_a_version() {
        let mut r = record(turns(&["u0", "a0", "u1", "a1", "u2", "a2"]));
        r.replace_from(2, turns(&["v1", "b1"]));
        assert_eq!(texts(&r), ["u0", "a0", "v1", "b1"]);
        assert_eq!(r.branch_points(), [BranchPoint { index: 2, shown: 1, count: 2 }]);
        check_forks(&r.messages, &r.forks).unwrap();

        // A reply written again: a version of the reply, the message stays.
        r.replace_from(2, turns(&["v1", "c1"]));
        assert_eq!(texts(&r), ["u0", "a0", "v1", "c1"]);
        assert_eq!(r.branch_points(), [2, 3].map(|index| BranchPoint { index, shown: 1, count: 2 }));

        // Back to the first version of message 2: the whole old continuation.
        r.switch_version(2, 0).unwrap();
        assert_eq!(texts(&r), ["u0", "a0", "u1", "a1", "u2", "a2"]);
        assert_eq!(r.branch_points(), [BranchPoint { index: 2, shown: 0, count: 2 }]);
        // And forward again: the version comes back with its own fork at the reply.
        r.switch_version(2, 1).unwrap();
        assert_eq!(texts(&r), ["u0", "a0", "v1", "c1"]);
        assert_eq!(r.branch_points().len(), 2);
        r.switch_version(3, 0).unwrap();
        assert_eq!(texts(&r), ["u0", "a0", "v1", "b1"]);
        check_forks(&r.messages, &r.forks).unwrap();

        // A third version of message 2 goes last and is shown.
        r.replace_from(2, turns(&["w1", "d1"]));
        assert_eq!(r.branch_points(), [BranchPoint { index: 2, shown: 2, count: 3 }]);
        r.switch_version(2, 0).unwrap();
        assert_eq!(texts(&r)[2], "u1");
        r.switch_version(2, 1).unwrap();
        assert_eq!(texts(&r), ["u0", "a0", "v1", "b1"], "version 2 kept its shown reply");
        assert!(r.switch_version(2, 3).is_err() && r.switch_version(0, 0).is_err());

        // The same text again is no new version.
        let before = r.clone();
        r.replace_from(2, turns(&["v1", "b1"]));
        assert_eq!(r, before);
    }

    #[test]
    fn forks_round_trip_flat_and_stay_flat_however_deep() {
        let mut r = record(turns(&["u0", "a0"]));
        // Each edit one message earlier than the last nests the older forks one deeper.
        for i in 0..40 {
            let mut path: Vec<String> = (0..40).map(|k| format!("u{k}")).collect();
            path[39 - i] = format!("edit {i}");
            let new: Vec<Message> = path.iter().flat_map(|u| [m(Role::User, u), m(Role::Assistant, "a")]).collect();
            r.replace_from(0, new);
        }
        check_forks(&r.messages, &r.forks).unwrap();
        let json = serde_json::to_string(&r).unwrap();
        let back: ChatRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["branches"].as_array().unwrap().len(), 40);
        let depth = |forks: &[Fork]| {
            let (mut deepest, mut stack) = (0, vec![(1, forks)]);
            while let Some((d, forks)) = stack.pop() {
                for f in forks {
                    deepest = deepest.max(d);
                    stack.extend(f.others.iter().map(|b| (d + 1, b.forks.as_slice())));
                }
            }
            deepest
        };
        assert!(depth(&r.forks) > 32, "nested {} deep: deeper than JSON could be", depth(&r.forks));
        assert!(value.get("forks").is_none());

        // Versions not in order are read in order; the free place is the shown one.
        let mut r = record(turns(&["u0", "a0", "u1", "a1"]));
        r.replace_from(2, turns(&["v1", "b1"]));
        r.replace_from(2, turns(&["w1", "c1"]));
        r.switch_version(2, 1).unwrap();
        let mut value = serde_json::to_value(&r).unwrap();
        value["branches"].as_array_mut().unwrap().reverse();
        let back: ChatRecord = serde_json::from_value(value).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.branch_points(), [BranchPoint { index: 2, shown: 1, count: 3 }]);
    }

    #[test]
    fn hostile_forks_are_refused() {
        let messages = turns(&["u0", "a0"]);
        let branch = |texts: &[&str]| Branch { messages: turns(texts), forks: Vec::new() };
        let fork = |at, others| Fork { at, shown: 0, others };
        assert!(check_forks(&messages, &[fork(0, vec![branch(&["v0", "b0"])])]).is_ok());
        let bad = [
            (vec![fork(2, vec![branch(&["v0"])])], "only 2 messages"),
            (vec![fork(0, vec![])], "shown"),
            (vec![Fork { at: 0, shown: 2, others: vec![branch(&["v0"])] }], "shown"),
            (vec![fork(0, vec![branch(&[])])], "empty"),
            (vec![fork(1, vec![branch(&["v0"])])], "role user for one of the role assistant"),
            (vec![fork(0, vec![branch(&["v0"])]), fork(0, vec![branch(&["v0"])])], "out of order"),
            (
                vec![fork(
                    0,
                    vec![Branch { messages: vec![m(Role::User, "x"), m(Role::System, "root")], forks: vec![] }],
                )],
                "role system",
            ),
            (
                vec![fork(0, vec![Branch { messages: turns(&["v0"]), forks: vec![fork(1, vec![branch(&["x"])])] }])],
                "a branch at message 2: its path has only 1 messages",
            ),
        ];
        for (forks, why) in bad {
            let e = check_forks(&messages, &forks).unwrap_err();
            assert!(e.contains(why), "{e} (wanted {why})");
        }

        // As stored: a branch of a later one, places taken twice or out of range, too many.
        let read = |branches: serde_json::Value| {
            let mut value = serde_json::to_value(record(messages.clone())).unwrap();
            value["branches"] = branches;
            serde_json::from_value::<ChatRecord>(value).map(|_| ()).map_err(|e| e.to_string())
        };
        let b = |from: Option<usize>, at: usize, version: usize| serde_json::json!({ "from": from, "at": at, "version": version, "messages": [{"role": "user", "content": "v"}] });
        assert!(read(serde_json::json!([b(None, 0, 0), b(Some(0), 0, 1)])).is_ok());
        for (branches, why) in [
            (serde_json::json!([b(Some(0), 0, 0)]), "not an earlier one"),
            (serde_json::json!([b(Some(1), 0, 0), b(None, 0, 0)]), "not an earlier one"),
            (serde_json::json!([b(None, 0, 0), b(None, 0, 0)]), "no place"),
            (serde_json::json!([b(None, 0, 2)]), "no place"),
            (serde_json::json!([b(None, 0, 0), b(None, 0, 3)]), "no place"),
            (serde_json::json!([{ "at": -1, "version": 0, "messages": [] }]), "invalid value"),
            (serde_json::Value::Array(vec![b(None, 0, 0); MAX_BRANCHES + 1]), "more than"),
        ] {
            let e = read(branches).unwrap_err();
            assert!(e.contains(why), "{e} (wanted {why})");
        }
    }

    #[test]
    fn the_branch_count_is_bounded_when_writing_too() {
        let mut r = record(turns(&["u0", "a0"]));
        for i in 0..MAX_BRANCHES + 5 {
            r.replace_from(0, turns(&[&format!("v{i}"), "b"]));
        }
        assert_eq!(r.branch_points()[0].count, MAX_BRANCHES + 1);
        let back: ChatRecord = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.branch_points(), r.branch_points());
    }
}
