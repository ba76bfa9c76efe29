//! Property tests of the decoder (issue 5): whatever bytes a student puts in
//! `spec` (or a broken filesystem puts in `started`/`outcome`), decoding never
//! panics, every rejection is one of the decoder's typed errors, and memory
//! stays bounded (a length prefix of 2^63 is an error, not an allocation).

use super::*;
use crate::{JobId, Outcome, ProtocolError, Resources, Result, Spec, Started, Task};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts, per thread, the bytes allocated and the largest single
/// allocation, so a test can bound what one decode costs.
struct Counting;
thread_local! {
    static TOTAL: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = TOTAL.try_with(|t| t.set(t.get() + l.size()));
        let _ = LARGEST.try_with(|m| m.set(m.get().max(l.size())));
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let _ = TOTAL.try_with(|t| t.set(t.get() + new));
        let _ = LARGEST.try_with(|m| m.set(m.get().max(new)));
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static ALLOC: Counting = Counting;

/// serde caps a sequence's pre-allocation at 1 MiB whatever its length
/// prefix says; everything else a decode allocates is bounded by the input
/// (itself at most MAX_SPEC_BYTES).
const DECODE_ALLOC_BOUND: usize = 2 * 1024 * 1024;

/// Decodes and returns (result, total bytes allocated, largest allocation).
fn measured<R: Record>(bytes: &[u8]) -> (Result<R>, usize, usize) {
    TOTAL.with(|t| t.set(0));
    LARGEST.with(|m| m.set(0));
    let r = decode::<R>(bytes, "spec");
    (r, TOTAL.with(|t| t.get()), LARGEST.with(|m| m.get()))
}

/// The only errors `decode` may return: no I/O, no path errors, no panic.
fn typed_rejection(e: &ProtocolError) -> bool {
    matches!(
        e,
        ProtocolError::TooLarge { .. }
            | ProtocolError::BadMagic { .. }
            | ProtocolError::VersionMismatch { .. }
            | ProtocolError::WrongKind { .. }
            | ProtocolError::Decode { .. }
    )
}

fn check<R: Record + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
    let (r, total, largest) = measured::<R>(bytes);
    prop_assert!(
        total <= DECODE_ALLOC_BOUND + 4 * bytes.len(),
        "decode allocated {total} bytes for {} input bytes",
        bytes.len()
    );
    prop_assert!(largest <= DECODE_ALLOC_BOUND, "one allocation of {largest} bytes");
    match r {
        Err(e) => {
            prop_assert!(typed_rejection(&e), "untyped rejection {e:?}");
            // The message is one printable sentence.
            prop_assert!(!e.to_string().is_empty());
        }
        // Whatever decodes re-encodes to a value that decodes the same.
        Ok(v) => {
            if let Ok(again) = encode(&v) {
                prop_assert_eq!(decode::<R>(&again, "spec").unwrap(), v);
            }
        }
    }
    Ok(())
}

fn header(kind: u8) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.push(kind);
    h.push(0);
    h.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h
}

/// Whether `e` is how decoding a body that does not decode under
/// [`header`]`(kind)` as an `R` must fail: another kind's record is the
/// wrong kind; `R`'s own fails to decode, or, for a record of a later
/// version than the header's (the spec), its upgrade fails.
fn broken_body_rejection<R: Record>(kind: u8, e: &ProtocolError) -> bool {
    match e {
        ProtocolError::WrongKind { .. } => kind != R::KIND,
        ProtocolError::Decode { .. } => kind == R::KIND && R::VERSION == PROTOCOL_VERSION,
        ProtocolError::VersionMismatch { found, expected, .. } => {
            kind == R::KIND && *found == PROTOCOL_VERSION && *expected == R::VERSION && R::VERSION != PROTOCOL_VERSION
        }
        _ => false,
    }
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    let task = prop_oneof![
        proptest::collection::vec(".{0,40}", 0..8).prop_map(|argv| Task::Command { argv }),
        (".{0,10}", ".{0,10}").prop_map(|(p, c)| Task::Python {
            python_version: p,
            cloudpickle_version: c
        }),
    ];
    (
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        ".{0,40}",
        task,
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()),
        proptest::collection::vec(("[A-Z_]{0,8}", ".{0,20}"), 0..4),
    )
        .prop_map(
            |(uid, gid, created_ms, image, task, (cpus, mem_bytes, time_limit_secs, nodes, gpus), env)| Spec {
                job_id: JobId::new(),
                uid,
                gid,
                created_ms,
                image,
                task,
                resources: Resources {
                    cpus,
                    mem_bytes,
                    time_limit_secs,
                    nodes,
                    gpus,
                    retries: gpus % 3,
                },
                env,
            },
        )
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Append(Vec<u8>),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        proptest::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = b.len().max(1);
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => b[i % n] ^= x | 1,
            Mutation::Flip(..) => {}
            Mutation::Truncate(i) => b.truncate(i % n),
            Mutation::Insert(i, v) => {
                let at = i % (b.len() + 1);
                b.splice(at..at, v.iter().copied());
            }
            Mutation::Append(v) => b.extend_from_slice(v),
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), kind in prop_oneof![Just(b'S'), Just(b'T'), Just(b'O'), any::<u8>()]) {
        // Raw garbage, and garbage behind a valid header (to reach postcard).
        check::<Spec>(&body)?;
        let mut b = header(kind);
        b.extend_from_slice(&body);
        check::<Spec>(&b)?;
        check::<Started>(&b)?;
        check::<Outcome>(&b)?;
    }

    #[test]
    fn mutated_valid_specs_never_panic(s in arb_spec(), muts in proptest::collection::vec(arb_mutation(), 1..4)) {
        let b = encode(&s).unwrap();
        prop_assert_eq!(decode::<Spec>(&b, "spec").unwrap(), s.clone());
        let m = apply(b, &muts);
        check::<Spec>(&m)?;
        // A spec that still decodes may be refused later, never crash the checks.
        if let Ok(s) = decode::<Spec>(&m, "spec") {
            let _ = s.validate();
        }
    }

    #[test]
    fn any_trailing_bytes_are_refused(s in arb_spec(), extra in proptest::collection::vec(any::<u8>(), 1..64)) {
        // The spec has no field for privileges, capabilities, mounts or
        // devices: a spec that carries anything more than its known
        // fields (as a newer or forged client might) is refused whole.
        let mut b = encode(&s).unwrap();
        b.extend_from_slice(&extra);
        let r = decode::<Spec>(&b, "spec");
        prop_assert!(matches!(r, Err(ProtocolError::Decode { ref reason, .. }) if reason.contains("trailing")), "{r:?}");
    }
}

/// Length prefixes far beyond the input (up to 2^64-1) are errors, not
/// allocations, for every variable-length field of every record.
#[test]
fn huge_length_prefixes_do_not_allocate() {
    let huge: [&[u8]; 3] = [
        &[0xff, 0xff, 0xff, 0xff, 0x0f],                               // 2^32-1
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],       // 2^63-1
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], // 2^64-1
    ];
    let valid = encode(&Spec {
        job_id: JobId::new(),
        uid: 1,
        gid: 1,
        created_ms: 1,
        image: "i".into(),
        task: Task::Command { argv: vec!["a".into()] },
        resources: Resources::default(),
        env: vec![("A".into(), "b".into())],
    })
    .unwrap();
    // The counter counts: decoding the valid spec allocates its strings.
    let (r, total, _) = measured::<Spec>(&valid);
    r.expect("the valid spec decodes");
    assert!(total > 0, "allocation counter is not counting");
    for prefix in huge {
        // The prefix at every offset of a valid spec: job id, image, argv
        // count, argv[0], env count, env name... whichever field it lands in.
        for at in HEADER_LEN..valid.len() {
            let mut b = valid[..at].to_vec();
            b.extend_from_slice(prefix);
            b.extend_from_slice(&valid[at..]);
            // Reaching the checks below: the decode did not panic.
            let (r, total, largest) = measured::<Spec>(&b);
            assert!(largest <= DECODE_ALLOC_BOUND, "offset {at}: one allocation of {largest} bytes");
            assert!(total <= DECODE_ALLOC_BOUND + 4 * b.len(), "offset {at}: {total} bytes");
            if let Err(e) = r {
                assert!(typed_rejection(&e), "{e:?}");
            }
        }
        for kind in [b'S', b'T', b'O'] {
            let mut b = header(kind);
            b.extend_from_slice(prefix);
            b.extend_from_slice(b"short");
            let (r, _, largest) = measured::<Spec>(&b);
            assert!(matches!(&r, Err(e) if broken_body_rejection::<Spec>(kind, e)), "{r:?}");
            assert!(largest <= DECODE_ALLOC_BOUND);
            let (r, _, largest) = measured::<Outcome>(&b);
            assert!(matches!(&r, Err(e) if broken_body_rejection::<Outcome>(kind, e)), "{r:?}");
            assert!(largest <= DECODE_ALLOC_BOUND);
            let (r, _, largest) = measured::<Started>(&b);
            assert!(matches!(&r, Err(e) if broken_body_rejection::<Started>(kind, e)), "{r:?}");
            assert!(largest <= DECODE_ALLOC_BOUND);
        }
    }
}
