use super::fixtures::*;
use super::*;
use crate::call::{CallRecord, ErrorKind};
use crate::error::ApiError;
use crate::fixtures;
use crate::ids::ObjectKey;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_call_goes_to_a_free_slot_and_waits_when_there_is_none() {
    let (t0, mut state) = start();
    let out = state.on(Event::Submitted(pending("a")), t0);
    assert!(assigns(&out).is_empty(), "no worker yet");
    assert_eq!(state.queued().values().sum::<usize>(), 1);
    let (_, out) = attach(&mut state, "w1", 1, t0);
    assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
    let out = state.on(Event::Submitted(pending("b")), t0);
    assert!(assigns(&out).is_empty(), "the only slot is busy");
    let out = state.on(assigned("a", 1), t0);
    assert!(matches!(
        out.as_slice(),
        [Command::Send {
            epoch: Epoch::FIRST,
            ..
        }]
    ));
    let out = state.on(finished("a"), t0);
    assert_eq!(assigns(&out), [("b".to_string(), "w1".to_string())]);
}

#[test]
fn a_lost_worker_has_its_calls_fenced_and_reassigned() {
    let (t0, mut state, s1) = w1_running_a(1);
    let out = state.on(detached("w1", s1, "stream closed"), t0);
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    let (_, out) = attach(&mut state, "w2", 1, t0);
    assert!(assigns(&out).is_empty(), "not before the fence is written");
    let out = state.on(fenced("a"), t0);
    assert_eq!(assigns(&out), [("a".to_string(), "w2".to_string())]);
}

#[test]
fn a_silent_worker_loses_its_lease_at_the_lease_and_not_before() {
    let (t0, mut state, session) = w1_running_a(1);
    assert_eq!(state.next_wake(), Some(t0 + Duration::from_secs(2)));
    let t1 = t0 + Duration::from_millis(1500);
    state.on(heartbeat("w1", session), t1);
    let out = state.on(Event::Tick, t0 + Duration::from_millis(3000));
    assert!(fences(&out).is_empty(), "the heartbeat renewed the lease");
    let out = state.on(Event::Tick, t1 + Duration::from_secs(2));
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::EndSession { session: s, .. } if *s == session))
    );
    assert!(state.workers().is_empty());
}

#[test]
fn an_abandoned_call_is_fenced_at_once_but_only_for_its_holder() {
    let (t0, mut state, session) = w1_running_a(2);
    let stale = state.on(abandoned("w1", session, "a", 7, "x"), t0);
    assert!(fences(&stale).is_empty(), "a stale epoch changes nothing");
    let out = state.on(
        abandoned("w1", session, "a", 1, "commit unacknowledged"),
        t0,
    );
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    let out = state.on(fenced("a"), t0);
    assert_eq!(
        assigns(&out),
        [("a".to_string(), "w1".to_string())],
        "the slot was freed; the worker itself is still alive"
    );
}

#[test]
fn a_store_error_keeps_the_call_and_retries_with_backoff() {
    let (t0, mut state) = start();
    attach(&mut state, "w1", 1, t0);
    state.on(Event::Submitted(pending("a")), t0);
    let out = state.on(assign_failed("a"), t0);
    assert!(assigns(&out).is_empty(), "not again at once");
    let wake = state.next_wake().expect("a retry is due");
    assert_eq!(wake, t0 + Duration::from_millis(200));
    let out = state.on(Event::Tick, wake);
    assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
    let out = state.on(assign_failed("a"), wake);
    assert!(assigns(&out).is_empty());
    assert_eq!(state.next_wake(), Some(wake + Duration::from_millis(400)));

    // A failed fence and a failed failure are retried too, never dropped.
    let t1 = t0 + Duration::from_secs(1);
    let out = state.on(Event::Tick, t1);
    assert_eq!(assigns(&out).len(), 1);
    let out = state.on(assigned("a", 1), t1);
    assert!(matches!(out.as_slice(), [Command::Send { .. }]));
    let out = state.on(fence_failed("a"), t1);
    assert!(out.is_empty(), "not fencing: nothing to retry");
}

#[test]
fn deadlines_fail_queued_calls_and_cancel_running_ones_after_grace() {
    let (t0, mut state) = start();
    let mut late = record("q");
    late.spec.deadline_ms = crate::call::now_ms() - 1;
    let out = state.on(Event::Submitted(Call::new(late, None)), t0);
    assert_eq!(fails(&out), [("q".to_string(), ErrorKind::Timeout)]);
    let out = state.on(fail_failed("q"), t0);
    assert!(fails(&out).is_empty());
    let out = state.on(Event::Tick, t0 + Duration::from_secs(1));
    assert_eq!(
        fails(&out),
        [("q".to_string(), ErrorKind::Timeout)],
        "retried"
    );
    state.on(finished("q"), t0);
}

#[test]
fn a_running_call_past_deadline_and_grace_is_cancelled_and_failed() {
    let (t0, mut state, _) = w1_running_a(1);
    // Age the call: its deadline moves into the past beyond the grace.
    if let Some(r) = state.running.get_mut(&call_id("a")) {
        let mut aged = (*r.call.record).clone();
        aged.spec.deadline_ms = crate::call::now_ms() - 6_000;
        r.call.deadline_ms = aged.spec.deadline_ms;
        r.call.record = Arc::new(aged);
    }
    let out = state.on(Event::Tick, t0);
    assert!(out.iter().any(
        |c| matches!(c, Command::Cancel { call_id, epoch: Epoch::FIRST, .. } if call_id == "a")
    ));
    assert_eq!(fails(&out), [("a".to_string(), ErrorKind::Timeout)]);
    assert_eq!(state.workers()[0].busy, 0, "the slot is free again");
}

#[test]
fn a_late_result_of_a_fenced_call_is_not_held() {
    let (t0, mut state, s1) = w1_running_a(1);
    assert!(holding(&state, "a", "w1", s1, 1).is_ok());
    state.on(detached("w1", s1, "x"), t0);
    assert!(
        holding(&state, "a", "w1", s1, 1).err() == Some(Refusal::NotHeld),
        "its result goes to the store, which refuses it"
    );
    state.on(fenced("a"), t0);
    let (s2, _) = attach(&mut state, "w2", 1, t0);
    state.on(assigned("a", 3), t0);
    assert!(holding(&state, "a", "w2", s2, 3).is_ok());
    assert!(
        holding(&state, "a", "w2", s2, 2).err() == Some(Refusal::StaleEpoch),
        "a stale epoch holds nothing"
    );
}

#[test]
fn recovered_calls_wait_for_their_worker_from_when_the_port_listens() {
    let (t0, mut state) = start();
    let orphan = running("a", 1, "w1");
    state.on(Event::Recovered(vec![orphan.clone()]), t0);
    assert!(state.reattaching(t0));
    // The catalog takes a minute to sync: the grace has not started.
    let t1 = t0 + Duration::from_secs(60);
    let out = state.on(Event::Tick, t1);
    assert!(fences(&out).is_empty());
    state.on(Event::Listening, t1);
    assert_eq!(state.next_wake(), Some(t1 + Duration::from_secs(5)));

    // Its worker re-attaches in time and keeps it.
    let out = state.on(
        Attaching {
            in_flight: vec![reported("a", 1, orphan)],
            ..attaching("w1", 1)
        }
        .into(),
        t1 + Duration::from_secs(1),
    );
    let (session, abandon) = registered(&out);
    assert!(abandon.is_empty(), "{abandon:?}");
    assert!(holding(&state, "a", "w1", session, 1).is_ok());
    for secs in [2, 4] {
        state.on(heartbeat("w1", session), t1 + Duration::from_secs(secs));
    }
    let out = state.on(Event::Tick, t1 + Duration::from_millis(5500));
    assert!(
        fences(&out).is_empty(),
        "adopted: the grace no longer applies"
    );
    assert!(holding(&state, "a", "w1", session, 1).is_ok());
}

#[test]
fn an_orphan_whose_worker_does_not_return_is_fenced_after_grace() {
    let (t0, mut state) = start();
    state.on(Event::Listening, t0);
    let orphan = running("a", 4, "w1");
    state.on(Event::Recovered(vec![orphan]), t0);
    let out = state.on(Event::Tick, t0 + Duration::from_secs(4));
    assert!(fences(&out).is_empty());
    let out = state.on(Event::Tick, t0 + Duration::from_secs(5));
    assert_eq!(fences(&out), [("a".to_string(), 4)]);
}

#[test]
fn an_orphan_its_worker_reattaches_without_is_fenced_at_once() {
    let (t0, mut state) = start();
    state.on(Event::Listening, t0);
    let kept = running("a", 3, "w1");
    state.on(
        Event::Recovered(vec![
            kept.clone(),
            running("b", 2, "w1"),
            running("c", 1, "w2"),
        ]),
        t0,
    );
    // w1 comes back holding only a: b is no longer running anywhere.
    let out = state.on(
        Attaching {
            in_flight: vec![reported("a", 3, kept)],
            ..attaching("w1", 1)
        }
        .into(),
        t0 + Duration::from_millis(300),
    );
    assert_eq!(fences(&out), [("b".to_string(), 2)]);
    let (session, abandon) = registered(&out);
    assert!(abandon.is_empty(), "{abandon:?}");
    assert!(holding(&state, "a", "w1", session, 3).is_ok());
    // c's worker has not come back: c waits out the grace as before (w1 heartbeats).
    for secs in [1, 2, 3, 4] {
        state.on(heartbeat("w1", session), t0 + Duration::from_secs(secs));
    }
    let out = state.on(Event::Tick, t0 + Duration::from_secs(4));
    assert!(fences(&out).is_empty());
    let out = state.on(Event::Tick, t0 + Duration::from_secs(5));
    assert_eq!(fences(&out), [("c".to_string(), 1)]);
}

#[test]
fn a_worker_of_another_pool_cannot_claim_a_call_by_its_worker_id() {
    let (t0, mut state) = start();
    state.on(Event::Listening, t0);
    let orphan = running("a", 1, "w1");
    state.on(Event::Recovered(vec![orphan.clone()]), t0);
    let out = state.on(
        Attaching {
            pool: "team/other".into(),
            in_flight: vec![reported("a", 1, orphan)],
            ..attaching("w1", 1)
        }
        .into(),
        t0,
    );
    let (session, abandon) = registered(&out);
    assert_eq!(abandon, ["a"]);
    assert_eq!(
        holding(&state, "a", "w1", session, 1).err(),
        Some(Refusal::NotHeld)
    );
}

#[test]
fn a_reattaching_worker_gives_up_calls_the_store_moved_on() {
    let (t0, mut state) = start();
    state.on(Event::Listening, t0);
    let out = state.on(
        Attaching {
            in_flight: vec![reported("a", 1, running("a", 2, "w2"))],
            ..attaching("w1", 1)
        }
        .into(),
        t0,
    );
    assert!(
        matches!(&out[0], Command::Registered { abandon, .. } if abandon == &["a".to_string()])
    );
    assert_eq!(state.workers()[0].busy, 0);
}

#[test]
fn a_second_session_of_a_worker_replaces_the_first_and_takes_back_unreported_calls() {
    let (t0, mut state, s1) = w1_running_a(2);
    let (s2, out) = attach_as(&mut state, "w1", 2, t0, Some("w1-secret"));
    assert_ne!(s1, s2);
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::EndSession { session, .. } if *session == s1))
    );
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    assert!(!is_session(&state, "w1", s1));
    // The old session's end changes nothing now.
    let out = state.on(detached("w1", s1, "closed"), t0);
    assert!(fences(&out).is_empty());
    assert!(is_session(&state, "w1", s2));
}

#[test]
fn admission_and_assignment_in_one_commit_uses_the_reserved_slot() {
    let (t0, mut state) = start();
    let (session, _) = attach(&mut state, "w1", 1, t0);
    let new = fixtures::new_call(&record("a"));
    assert_eq!(state.reserve(&new), Ok(Some("w1".into())));
    let mut other = new.clone();
    other.id = "b".into();
    assert_eq!(state.reserve(&other), Ok(None), "the only slot is reserved");
    let out = state.on(
        Event::AdmittedAssigned {
            call: Call::new(running("a", 1, "w1"), None),
            epoch: Epoch::FIRST,
        },
        t0,
    );
    assert!(matches!(
        out.as_slice(),
        [Command::Send {
            epoch: Epoch::FIRST,
            ..
        }]
    ));
    assert!(holding(&state, "a", "w1", session, 1).is_ok());
    unreserve(&mut state, "zzz");
    assert_eq!(state.workers()[0].busy, 1);
}

#[test]
fn a_session_may_act_only_on_calls_it_holds_under_their_epoch() {
    let (t0, mut state) = start();
    let (s1, _) = attach(&mut state, "w1", 1, t0);
    let (s2, _) = attach(&mut state, "w2", 1, t0);
    // Queued while the assignment is being written: nobody holds it yet.
    let out = state.on(Event::Submitted(pending("a")), t0);
    let holder = assigns(&out)[0].1.clone();
    let (holder_session, rogue, rogue_session) = if holder == "w1" {
        (s1, "w2", s2)
    } else {
        (s2, "w1", s1)
    };
    assert_eq!(
        holding(&state, "a", &holder, holder_session, 0).err(),
        Some(Refusal::NotHeld)
    );
    state.on(assigned("a", 1), t0);
    assert!(holding(&state, "a", &holder, holder_session, 1).is_ok());
    assert_eq!(
        holding(&state, "a", &holder, holder_session, 2).err(),
        Some(Refusal::StaleEpoch)
    );
    assert_eq!(
        holding(&state, "a", rogue, rogue_session, 1).err(),
        Some(Refusal::NotHeld),
        "another worker's call"
    );
    assert_eq!(
        holding(&state, "a", &holder, holder_session + 100, 1).err(),
        Some(Refusal::NotHeld),
        "another session of the holder"
    );
    assert_eq!(
        holding(&state, "zzz", &holder, holder_session, 1).err(),
        Some(Refusal::NotHeld)
    );
    // The rogue cannot give the call up either: nothing is fenced, the holder keeps it.
    let out = state.on(abandoned(rogue, rogue_session, "a", 1, "forged"), t0);
    assert!(fences(&out).is_empty());
    assert!(holding(&state, "a", &holder, holder_session, 1).is_ok());
    assert_eq!(Refusal::NotHeld.as_str(), "not-held");
    assert_eq!(Refusal::StaleEpoch.to_string(), "stale-epoch");
}

#[test]
fn a_same_id_newcomer_without_the_session_secret_is_refused_and_changes_nothing() {
    let (t0, mut state, s1) = w1_running_a(1);
    for resume in [None, Some("w2-secret"), Some("w1-secre")] {
        let out = state.on(
            Attaching {
                in_flight: vec![reported("a", 1, running("a", 1, "w1"))],
                secret: "rogue-secret".into(),
                resume: resume.map(String::from),
                ..attaching("w1", 8)
            }
            .into(),
            t0 + Duration::from_millis(500),
        );
        assert!(
            matches!(out.as_slice(), [Command::RefuseAttach { session, .. }] if *session == s1),
            "{resume:?}: {out:?}"
        );
        assert!(is_session(&state, "w1", s1));
        assert!(holding(&state, "a", "w1", s1, 1).is_ok());
        assert_eq!(state.workers()[0].slots, 1);
    }
    // Once the first session is dead (its lease lapsed), the id is free again.
    let later = t0 + Duration::from_secs(3);
    let (s2, out) = attach(&mut state, "w1", 1, later);
    assert_ne!(s1, s2);
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    assert!(is_session(&state, "w1", s2));
}

#[test]
fn read_write_calls_of_one_workspace_run_one_at_a_time_and_others_do_not_wait() {
    use crate::call::Filesystem::{ReadOnly, ReadWrite};
    let (t0, mut state) = start();
    attach(&mut state, "w1", 8, t0);
    let ids = submit_ids(
        &mut state,
        vec![
            with_fs("w-a1", "a", ReadWrite),
            with_fs("w-a2", "a", ReadWrite),
            with_fs("r-a", "a", ReadOnly),
            with_fs("w-b", "b", ReadWrite),
            pending("plain"),
        ],
        t0,
    );
    assert_eq!(ids, ["w-a1", "r-a", "w-b", "plain"], "w-a2 waits for w-a1");
    state.on(assigned("w-a1", 1), t0);
    let out = state.on(finished("w-a1"), t0);
    assert_eq!(assigns(&out), [("w-a2".to_string(), "w1".to_string())]);
}

#[test]
fn a_writer_keeps_its_workspace_while_it_is_fenced_and_reassigned() {
    use crate::call::Filesystem::ReadWrite;
    let (t0, mut state) = start();
    let (s1, _) = attach(&mut state, "w1", 1, t0);
    let ids = submit_ids(&mut state, vec![with_fs("first", "a", ReadWrite)], t0);
    assert_eq!(ids, ["first"]);
    state.on(assigned("first", 1), t0);
    let out = state.on(detached("w1", s1, "killed"), t0);
    assert_eq!(fences(&out), [("first".to_string(), 1)]);
    // A second writer arrives while the first is being fenced, and a worker frees up.
    let (_, out) = attach(&mut state, "w2", 2, t0);
    assert!(assigns(&out).is_empty());
    let ids = submit_ids(&mut state, vec![with_fs("second", "a", ReadWrite)], t0);
    assert!(
        ids.is_empty(),
        "the fenced writer still holds the workspace"
    );
    let out = state.on(fenced("first"), t0);
    assert_eq!(assigns(&out), [("first".to_string(), "w2".to_string())]);
    let out = state.on(finished("first"), t0);
    assert_eq!(assigns(&out), [("second".to_string(), "w2".to_string())]);
}

#[test]
fn admission_does_not_reserve_a_slot_for_a_second_writer() {
    use crate::call::Filesystem::{ReadOnly, ReadWrite};
    let (t0, mut state) = start();
    attach(&mut state, "w1", 4, t0);
    let new = |id: &str, fs| fixtures::new_call(&with_fs(id, "a", fs).record);
    assert!(
        state
            .reserve(&new("one", ReadWrite))
            .is_ok_and(|w| w.is_some())
    );
    assert!(
        state
            .reserve(&new("two", ReadWrite))
            .is_ok_and(|w| w.is_none())
    );
    assert!(
        state
            .reserve(&new("reader", ReadOnly))
            .is_ok_and(|w| w.is_some())
    );
    unreserve(&mut state, "one");
    assert!(
        state
            .reserve(&new("two", ReadWrite))
            .is_ok_and(|w| w.is_some())
    );
}

#[test]
fn after_a_restart_a_writer_assigned_before_goes_before_one_never_assigned() {
    use crate::call::Filesystem::ReadWrite;
    let (t0, mut state) = start();
    let mut fresh = with_fs("fresh", "a", ReadWrite).record.as_ref().clone();
    fresh.created_at_ms = 1;
    let mut fenced = with_fs("fenced", "a", ReadWrite).record.as_ref().clone();
    fenced.epoch = 2;
    state.on(Event::Recovered(vec![fresh, fenced]), t0);
    let (_, out) = attach(&mut state, "w1", 4, t0);
    assert_eq!(assigns(&out), [("fenced".to_string(), "w1".to_string())]);
}

#[test]
fn a_call_to_retry_is_taken_back_and_queued_again_after_its_backoff() {
    let (t0, mut state, s1) = w1_running_a(1);
    let retry =
        |session: u64, epoch: u64| retrying("w1", session, "a", epoch, Duration::from_secs(1));
    // Only the session holding the call under that epoch may send it back.
    assert!(fences(&state.on(retry(s1 + 7, 1), t0)).is_empty());
    assert!(fences(&state.on(retry(s1, 2), t0)).is_empty());
    let out = state.on(retry(s1, 1), t0);
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    assert!(assigns(&out).is_empty());
    // Fenced: it waits out its backoff, though its worker's slot is free.
    let out = state.on(fenced("a"), t0);
    assert!(assigns(&out).is_empty(), "not before the backoff");
    assert_eq!(state.queued().values().sum::<usize>(), 1);
    assert_eq!(state.next_wake(), Some(t0 + Duration::from_secs(1)));
    let other = state.on(
        Event::Submitted(pending("b")),
        t0 + Duration::from_millis(10),
    );
    assert_eq!(
        assigns(&other),
        [("b".to_string(), "w1".to_string())],
        "the waiting call does not hold the slot"
    );
    state.on(finished("b"), t0 + Duration::from_millis(20));
    let out = state.on(Event::Tick, t0 + Duration::from_millis(999));
    assert!(assigns(&out).is_empty());
    let out = state.on(Event::Tick, t0 + Duration::from_secs(1));
    assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
}

#[test]
fn a_call_waiting_out_its_backoff_keeps_its_deadline() {
    let (t0, mut state) = start();
    let (s1, _) = attach(&mut state, "w1", 1, t0);
    let mut late = record("a");
    // Far at first; it passes while the call waits out its backoff (below).
    late.spec.deadline_ms = crate::call::now_ms() + 60_000;
    let out = state.on(Event::Submitted(Call::new(late, None)), t0);
    assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
    state.on(assigned("a", 1), t0);
    let out = state.on(retrying("w1", s1, "a", 1, Duration::from_secs(30)), t0);
    assert_eq!(fences(&out), [("a".to_string(), 1)]);
    state.on(fenced("a"), t0);
    assert!(state.next_deadline_ms().is_some());
    // The queued call's deadline moves into the past: the next look fails it.
    state.queue.update(&CallId::from("a"), |q| {
        let mut record = (*q.call.record).clone();
        record.spec.deadline_ms = crate::call::now_ms() - 60_000;
        q.call = Call::new(record, None);
    });
    let out = state.on(Event::Tick, t0 + Duration::from_millis(1));
    assert_eq!(fails(&out), [("a".to_string(), ErrorKind::Timeout)]);
    assert!(assigns(&out).is_empty());
}

/// A running call whose tool reports progress, timeout 10 s and maxTimeout 60 s, that
/// started 16 s ago (so its first deadline is 6 s past, beyond the grace).
fn progressing(state: &mut State, id: &str, t0: Instant) -> i64 {
    running_on(state, id, "w1", t0);
    let now = crate::call::now_ms();
    if let Some(r) = state.running.get_mut(&call_id(id)) {
        let mut record = (*r.call.record).clone();
        record.spec.limits.timeout_ms = 10_000;
        record.spec.limits.max_timeout_ms = 60_000;
        record.spec.deadline_ms = now - 6_000;
        r.call = Call::new(record, None);
    }
    now
}

#[test]
fn progress_moves_a_running_calls_deadline_up_to_its_max_timeout() {
    let (t0, mut state) = start();
    attach(&mut state, "w1", 2, t0);
    let now = progressing(&mut state, "a", t0);
    progressed(&mut state, "a", now);
    assert_eq!(deadline_of(&state, "a"), Some(now + 10_000));
    // Progressing, it is not cut off at its first deadline.
    let out = state.on(Event::Tick, t0);
    assert!(fails(&out).is_empty(), "{out:?}");
    // However much it reports, never past started + maxTimeout.
    progressed(&mut state, "a", now + 1_000_000);
    assert_eq!(deadline_of(&state, "a"), Some(now - 16_000 + 60_000));
    // An older report does not move it back.
    progressed(&mut state, "a", now);
    assert_eq!(deadline_of(&state, "a"), Some(now + 44_000));
    // The same call without progress is cut off.
    let _ = progressing(&mut state, "b", t0);
    let out = state.on(Event::Tick, t0);
    assert_eq!(fails(&out), [("b".to_string(), ErrorKind::Timeout)]);
}

#[test]
fn a_restart_keeps_the_deadline_recorded_progress_gave_a_call() {
    let (t0, mut state) = start();
    let now = crate::call::now_ms();
    let mut pending = CallRecord {
        epoch: 2,
        ..record("p")
    };
    pending.spec.limits.timeout_ms = 10_000;
    pending.spec.limits.max_timeout_ms = 60_000;
    pending.spec.deadline_ms = now - 1_000;
    let mut late = pending.clone();
    late.id = "late".into();
    state.restore_deadlines([(call_id("p"), now + 9_000)].into());
    let out = state.on(Event::Recovered(vec![pending, late]), t0);
    // Without its progress the call would have expired already; with it, it queues.
    assert_eq!(fails(&out), [("late".to_string(), ErrorKind::Timeout)]);
    assert_eq!(deadline_of(&state, "p"), Some(now + 9_000));
}

#[test]
fn a_stopped_call_is_forgotten_and_its_worker_told_to_stop() {
    let (t0, mut state, _) = w1_running_a(1);
    // Another call waits for the slot.
    let out = state.on(Event::Submitted(pending("b")), t0);
    assert!(assigns(&out).is_empty());
    let out = state.on(stopped("a", "cancelled by operator:x"), t0);
    assert!(
        out.iter().any(
            |c| matches!(c, Command::Cancel { call_id, epoch: Epoch::FIRST, .. } if call_id == "a")
        ),
        "{out:?}"
    );
    // Its slot goes to the next call at once.
    assert_eq!(assigns(&out), [("b".to_string(), "w1".to_string())]);
    // A queued call stopped is just dropped.
    let out = state.on(Event::Submitted(pending("c")), t0);
    assert!(assigns(&out).is_empty());
    let out = state.on(stopped("c", "cancelled"), t0);
    assert!(!out.iter().any(|c| matches!(c, Command::Cancel { .. })));
    assert_eq!(state.queued().values().sum::<usize>(), 0);
}

// Fair share between agents.

#[test]
fn agents_with_queued_calls_take_turns_for_a_slot() {
    let (t0, mut state) = start();
    attach(&mut state, "w1", 1, t0);
    let calls = vec![
        of_agent("a1", "alice"),
        of_agent("a2", "alice"),
        of_agent("a3", "alice"),
        of_agent("a4", "alice"),
        of_agent("b1", "bob"),
        of_agent("b2", "bob"),
        of_agent("c1", "carol"),
    ];
    assert_eq!(submit_ids(&mut state, calls, t0), ["a1"]);
    let mut order = Vec::new();
    let mut running = "a1".to_string();
    for step in 1..=6u64 {
        let now = t0 + Duration::from_millis(step);
        let out = state.on(finished(&running), now);
        let assigned = assigns(&out);
        assert_eq!(
            assigned.len(),
            1,
            "one slot frees, one call goes: {assigned:?}"
        );
        running = assigned[0].0.clone();
        order.push(running.clone());
    }
    // alice's flood does not hold bob and carol back: each lane gets one call per turn.
    assert_eq!(order, ["a2", "b1", "c1", "a3", "b2", "a4"]);
    assert_eq!(state.queued().values().sum::<usize>(), 0);
}

#[test]
fn a_lane_that_cannot_go_passes_its_turn() {
    let (t0, mut state) = start();
    attach(&mut state, "w1", 1, t0);
    // alice's only queued call waits out a store retry backoff; bob's goes meanwhile.
    state.on(Event::Submitted(of_agent("a1", "alice")), t0);
    state.on(assign_failed("a1"), t0);
    let out = state.on(Event::Submitted(of_agent("b1", "bob")), t0);
    assert_eq!(assigns(&out), [("b1".to_string(), "w1".to_string())]);
    state.on(finished("b1"), t0 + Duration::from_millis(1));
    let out = state.on(Event::Tick, t0 + Duration::from_millis(200));
    assert_eq!(assigns(&out), [("a1".to_string(), "w1".to_string())]);
}

#[test]
fn admission_refuses_a_call_past_its_agents_cap_and_only_that_agents() {
    let (_, state) = start();
    let mut state = state.with_max_per_agent(2);
    let new = |id: &str, agent: Option<&str>| {
        let mut r = record(id);
        r.spec.access.agent = agent.map(String::from);
        fixtures::new_call(&r)
    };
    // No worker: every call queues, and counts in its lane from its admission on.
    assert_eq!(state.reserve(&new("a1", Some("alice"))), Ok(None));
    assert_eq!(state.reserve(&new("a2", Some("alice"))), Ok(None));
    let full = state
        .reserve(&new("a3", Some("alice")))
        .expect_err("alice's lane is full");
    assert_eq!(
        (full.lane.party.clone(), full.queued, full.max),
        (Party::Agent(ObjectKey::new("default", "alice")), 2, 2)
    );
    assert_eq!(
        ApiError::from(full).kind,
        crate::error::ErrorKind::QueueFull
    );
    // Another agent, and operators' own calls, have lanes of their own.
    assert_eq!(state.reserve(&new("b1", Some("bob"))), Ok(None));
    assert_eq!(state.reserve(&new("op1", None)), Ok(None));
    // Submitted, a call still counts; a call whose admission did not record it does not.
    let (t0, _) = start();
    state.on(Event::Submitted(of_agent("a1", "alice")), t0);
    assert!(state.reserve(&new("a3", Some("alice"))).is_err());
    unreserve(&mut state, "a2");
    assert_eq!(state.reserve(&new("a3", Some("alice"))), Ok(None));
    state.on(Event::Submitted(of_agent("a3", "alice")), t0);
    assert!(state.reserve(&new("a4", Some("alice"))).is_err());
    // A call that starts frees its place in the lane.
    let (_, out) = attach(&mut state, "w1", 1, t0);
    assert_eq!(assigns(&out).len(), 1);
    assert_eq!(state.reserve(&new("a4", Some("alice"))), Ok(None));
}

#[test]
fn a_call_taken_back_from_a_lost_worker_keeps_its_place_in_its_lane() {
    let (t0, mut state) = start();
    let (s1, _) = attach(&mut state, "w1", 1, t0);
    let calls = vec![
        of_agent("a1", "alice"),
        of_agent("a2", "alice"),
        of_agent("b1", "bob"),
    ];
    assert_eq!(submit_ids(&mut state, calls, t0), ["a1"]);
    state.on(assigned("a1", 1), t0);
    // The cap is for admission: a call coming back is never refused, even into a full lane.
    let mut state = state.with_max_per_agent(1);
    let out = state.on(detached("w1", s1, "stream closed"), t0);
    assert_eq!(fences(&out), [("a1".to_string(), 1)]);
    state.on(fenced("a1"), t0);
    let new_a = fixtures::new_call(&of_agent("a9", "alice").record);
    assert!(
        state.reserve(&new_a).is_err(),
        "alice has two calls waiting"
    );
    let t1 = t0 + Duration::from_secs(1);
    let (_, out) = attach(&mut state, "w2", 1, t1);
    assert_eq!(
        assigns(&out),
        [("a1".to_string(), "w2".to_string())],
        "the call taken back goes before alice's later one"
    );
    let mut order = Vec::new();
    let mut running = "a1".to_string();
    for step in 1..=2u64 {
        let out = state.on(finished(&running), t1 + Duration::from_millis(step));
        running = assigns(&out)[0].0.clone();
        order.push(running.clone());
    }
    assert_eq!(order, ["b1", "a2"]);
}

#[test]
fn a_waiting_call_of_one_pool_does_not_keep_another_pools_call_from_a_free_slot() {
    let (t0, mut state) = start();
    state.on(Event::Submitted(of_agent("a1", "alice")), t0);
    let other = Attaching {
        pool: "default/other".into(),
        ..attaching("w9", 1)
    };
    state.on(other.into(), t0);
    let mut r = of_agent("o1", "alice").record.as_ref().clone();
    r.spec.pool = "default/other".into();
    assert_eq!(
        state.reserve(&fixtures::new_call(&r)),
        Ok(Some("w9".into()))
    );
}

#[test]
fn a_draining_worker_is_offered_no_new_call_and_keeps_the_one_it_holds() {
    let (t0, mut state, s1) = w1_running_a(2);
    let out = state.on(draining("w1", s1), t0);
    assert!(fences(&out).is_empty(), "its call stays on it");
    let out = state.on(Event::Submitted(pending("b")), t0);
    assert!(
        assigns(&out).is_empty(),
        "a free slot, but the worker is stopping"
    );
    let (_, out) = attach(&mut state, "w2", 1, t0);
    assert_eq!(assigns(&out), [("b".to_string(), "w2".to_string())]);
    // A later heartbeat without the flag does not undo it.
    let out = state.on(heartbeat("w1", s1), t0);
    assert!(out.is_empty(), "{out:?}");
    let out = state.on(Event::Submitted(pending("c")), t0);
    assert!(assigns(&out).is_empty(), "w2 is busy, w1 still stopping");
    // Its call ends there, as ever.
    let out = state.on(finished("a"), t0);
    assert!(assigns(&out).is_empty(), "{out:?}");
}

#[test]
fn an_operators_drain_tells_the_worker_and_offers_it_nothing_more() {
    let (t0, mut state, s1) = w1_running_a(2);
    let out = state.on(
        Event::Drain {
            worker: "w1".into(),
        },
        t0,
    );
    assert!(
        matches!(out.as_slice(), [Command::Drain { worker, session }] if worker.as_str() == "w1" && *session == s1),
        "{out:?}"
    );
    let out = state.on(Event::Submitted(pending("b")), t0);
    assert!(assigns(&out).is_empty(), "{out:?}");
    let out = state.on(
        Event::Drain {
            worker: "nobody".into(),
        },
        t0,
    );
    assert!(out.is_empty(), "no such worker: nothing to do");
}

#[test]
fn the_earliest_waiting_deadline_follows_the_queue_as_calls_come_and_go() {
    let (t0, mut state) = start();
    assert_eq!(state.next_deadline_ms(), None);
    let base = crate::call::now_ms() + 600_000;
    for (id, offset) in [("a", 30), ("b", 10), ("c", 20)] {
        let mut call = record(id);
        call.spec.deadline_ms = base + offset;
        state.on(Event::Submitted(Call::new(call, None)), t0);
    }
    assert_eq!(state.next_deadline_ms(), Some(base + 10), "b's");
    // b is cancelled: the queue lets it go, and its deadline with it.
    state.queue.retain(|q| q.call.record.id != "b");
    assert_eq!(state.next_deadline_ms(), Some(base + 20), "c's");
    // A worker takes the queue's front (a, then c): nothing waits, no deadline is due.
    let (_, out) = attach(&mut state, "w1", 2, t0);
    assert_eq!(assigns(&out).len(), 2, "{out:?}");
    assert!(
        state.next_deadline_ms().is_none_or(|d| d > base + 30),
        "only running calls' deadlines (with grace) remain"
    );
}
