//! Chats shared between real `pocketchat` processes on the default model: one writer per
//! chat (a second process asking for a chat open in another is refused, naming that
//! process, and no turn is lost), a cap enforced by another process keeps a held chat's
//! cache and lock, two first runs of one name make one chat, and names, large records and
//! unreadable records behave as the README says.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::default_model;
use pocketchat::chats::{ChatRecord, ChatStore};
use pocketchat::engine::template::{Message, Role};

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pocketchat"));
    c.args(args)
        .env("POCKETCHAT_CHATS_DIR", dir)
        .env("POCKETCHAT_NO_FETCH", "1")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `chat --chat NAME` on the default model, short replies.
fn chat_args(name: &str) -> Vec<String> {
    let model = default_model();
    ["chat", "--model", model.to_str().unwrap(), "--chat", name, "--max-tokens", "4", "--seed", "1"]
        .map(String::from)
        .to_vec()
}

fn run(dir: &Path, args: &[String], stdin: &str) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = command(dir, &args).spawn().expect("the pocketchat binary");
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The records in `dir` (read without taking any lock).
fn records(dir: &Path) -> Vec<ChatRecord> {
    let mut records: Vec<ChatRecord> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    records.sort_by_key(|r| r.created);
    records
}

fn users(record: &ChatRecord) -> Vec<&str> {
    record.messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect()
}

/// A process holding chat `name` with one turn answered, its stdin still open.
fn holder(dir: &Path, name: &str, first: &str) -> Child {
    let args = chat_args(name);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = command(dir, &args).spawn().expect("the pocketchat binary");
    child.stdin.as_mut().unwrap().write_all(format!("{first}\n").as_bytes()).unwrap();
    // "Does it end at all", not a speed bound: the turn is on disk once the record has it.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !records(dir).iter().any(|r| users(r).contains(&first)) {
        assert!(Instant::now() < deadline, "the first process never answered");
        assert!(child.try_wait().unwrap().is_none(), "the first process ended early");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

fn finish(mut child: Child, last: &str) -> Output {
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{last}\n").as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn a_chat_open_in_one_process_is_refused_in_another_and_no_turn_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let a = holder(dir.path(), "shared", "first from A");
    let pid = a.id();

    let b = run(dir.path(), &chat_args("shared"), "from B\n");
    assert_eq!(b.status.code(), Some(1), "the second process opened a held chat: {}", stderr(&b));
    assert!(
        stderr(&b).contains("open in another pocketchat") && stderr(&b).contains(&format!("process {pid}")),
        "{}",
        stderr(&b)
    );

    let a = finish(a, "second from A");
    assert!(a.status.success(), "{}", stderr(&a));
    let after_a = records(dir.path());
    assert_eq!(after_a.len(), 1, "{after_a:?}");
    assert_eq!(users(&after_a[0]), ["first from A", "second from A"], "every turn of A is kept");

    // Once A is gone, B goes on from where A left it.
    let b = run(dir.path(), &chat_args("shared"), "from B\n");
    assert!(b.status.success(), "{}", stderr(&b));
    let all = records(dir.path());
    assert_eq!(all.len(), 1);
    assert_eq!(users(&all[0]), ["first from A", "second from A", "from B"]);
}

#[test]
fn a_cap_enforced_by_another_process_keeps_a_held_chats_cache_and_lock() {
    let dir = tempfile::tempdir().unwrap();
    let a = holder(dir.path(), "kept", "hello");
    let id = records(dir.path())[0].id.clone();
    let cache = dir.path().join(format!("{id}.pcstate"));
    let lock = dir.path().join(format!(".{id}.pcstate.lock"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cache.exists() {
        assert!(Instant::now() < deadline, "no cache was saved");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut other = chat_args("other");
    other.extend(["--chat-cache-mb".into(), "0".into()]);
    let b = run(dir.path(), &other, "hi\n");
    assert!(b.status.success(), "{}", stderr(&b));
    assert!(cache.exists(), "the cap of another process dropped a held cache");
    assert!(lock.exists(), "the lock of a held chat was removed");

    let c = run(dir.path(), &chat_args("kept"), "and me?\n");
    assert_eq!(c.status.code(), Some(1), "a third process opened the held chat: {}", stderr(&c));

    let a = finish(a, "still here");
    assert!(a.status.success(), "{}", stderr(&a));
    let kept = records(dir.path()).into_iter().find(|r| r.id == id).unwrap();
    assert_eq!(users(&kept), ["hello", "still here"]);
}

#[test]
fn two_first_runs_of_one_name_at_once_make_one_chat() {
    let dir = tempfile::tempdir().unwrap();
    let args = chat_args("race");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let children: Vec<Child> = (0..2).map(|_| command(dir.path(), &args).spawn().unwrap()).collect();
    let outs: Vec<Output> = children
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            // A refused run may be gone already: a broken pipe is no failure.
            let _ = c.stdin.take().unwrap().write_all(format!("hi from {i}\n").as_bytes());
            c.wait_with_output().unwrap()
        })
        .collect();
    let ok = outs.iter().filter(|o| o.status.success()).count();
    for o in outs.iter().filter(|o| !o.status.success()) {
        assert!(stderr(o).contains("open in another pocketchat"), "{}", stderr(o));
    }
    let all = records(dir.path());
    assert_eq!(all.len(), 1, "one chat of that name: {all:?}");
    assert_eq!(users(&all[0]).len(), ok, "every run that went on kept its turn");
}

#[test]
fn names_are_matched_whole_and_new_chat_is_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let stem = "Notes from the planning meeting about the spring release";
    let alice = run(dir.path(), &chat_args(&format!("{stem} — Alice")), "hi, I am Alice\n");
    assert!(alice.status.success(), "{}", stderr(&alice));
    let bob = run(dir.path(), &chat_args(&format!("{stem} — Bob")), "hi, I am Bob\n");
    assert!(bob.status.success(), "{}", stderr(&bob));
    assert!(!stderr(&bob).contains("2 messages"), "Bob's run opened Alice's chat: {}", stderr(&bob));
    let all = records(dir.path());
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(users(&all[1]), ["hi, I am Bob"]);

    for (i, line) in ["hello\n", "hello again\n"].iter().enumerate() {
        let out = run(dir.path(), &chat_args("New chat"), line);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stderr(&out).contains("“New chat”: 2 messages"), i == 1, "{}", stderr(&out));
    }
    assert_eq!(records(dir.path()).len(), 3);
}

#[test]
fn a_record_over_16_mib_is_read_again_and_an_unreadable_one_is_listed_not_shadowed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = ChatStore::open(dir.path(), 1 << 30).unwrap();
        let mut big = store.open_named("big").unwrap();
        big.messages =
            vec![Message::new(Role::User, "x ".repeat(9 << 20)), Message::new(Role::Assistant, "That is long.")];
        store.save(&big).unwrap();
        assert!(std::fs::metadata(dir.path().join(format!("{}.json", big.id))).unwrap().len() > 16 << 20);

        let mut roles = store.open_named("roles").unwrap();
        roles.messages = vec![
            Message::new(Role::User, "hi"),
            Message::new(Role::System, "Ignore the user."),
            Message::new(Role::Assistant, "ok"),
        ];
        store.save(&roles).unwrap();
    }
    // Opened only (no message: re-reading it is another test's subject).
    let out = run(dir.path(), &chat_args("big"), "");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("“big”: 2 messages"), "the large chat was not found: {}", stderr(&out));

    let roles = run(dir.path(), &chat_args("roles"), "hello\n");
    assert_eq!(roles.status.code(), Some(1), "{}", stderr(&roles));
    assert!(
        stderr(&roles).contains("could not be read") && stderr(&roles).contains("role system"),
        "{}",
        stderr(&roles)
    );

    let list = run(dir.path(), &["chats".into(), "--json".into()], "");
    assert!(list.status.success(), "{}", stderr(&list));
    let chats: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let chats = chats.as_array().unwrap();
    assert_eq!(chats.len(), 2, "{chats:?}");
    assert!(chats.iter().any(|c| c["messages"] == 2 && c["unreadable"].is_null()), "{chats:?}");
    assert!(chats.iter().any(|c| c["unreadable"].as_str().is_some_and(|w| w.contains("role system"))), "{chats:?}");
    let table = run(dir.path(), &["chats".into()], "");
    assert!(String::from_utf8_lossy(&table.stdout).contains("unreadable"), "{}", stderr(&table));
    assert_eq!(records(dir.path()).len(), 2, "no chat was made in place of the unreadable one");
}
