//! `-R 1` and `-R 2`: the bench's buffers registered with the communicators.

use crate::ranks::Bench;

/// `-R 1`: every rank's send and receive buffers registered with its communicators (ours
/// and the baseline's), for the rest of the run.
pub fn buffers(b: &Bench) -> Result<(), String> {
    for (i, r) in b.ranks.iter().enumerate() {
        for buf in [&r.send, &r.recv] {
            // SAFETY: the buffers live as long as the communicators (Bench drops them after).
            unsafe { r.comm.register_raw(buf.ptr(), buf.bytes()) }
                .map_err(|e| format!("ncclCommRegister (nccl-rs, rank {}): {e}", r.global))?;
            if let Some((lib, comms)) = &b.nccl {
                lib.register(&comms[i], buf.ptr(), buf.bytes())?;
            }
        }
    }
    println!("# buffers registered with ncclCommRegister (-R 1)");
    Ok(())
}

/// `-R 2`: every rank's send and receive buffers registered as symmetric windows of its
/// communicator (a collective call: a thread per rank of this process), for the rest of the
/// run. The baseline's buffers stay as they are.
pub fn windows(b: &Bench) -> Result<(), String> {
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = b
            .ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    for buf in [&r.send, &r.recv] {
                        // SAFETY: the buffers live as long as the communicators.
                        unsafe { r.comm.window_register_raw(buf.ptr(), buf.bytes(), 1) }.map_err(
                            |e| format!("ncclCommWindowRegister (nccl-rs, rank {}): {e}", r.global),
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    println!(
        "# buffers registered as symmetric windows (-R 2; nccl-rs only, the baseline's are not)"
    );
    Ok(())
}
