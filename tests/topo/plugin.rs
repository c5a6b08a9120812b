//! The tuner plugin interface (NCCL_TUNER_PLUGIN), with tiny plugins compiled by `cc` here (a
//! missing compiler is a failure).

use crate::common;
use nccl::graph::{self, Params};
use nccl::topo::System;
use nccl::tune::{Algo, Coll, Proto, TuneParams, Tuner};
use std::path::PathBuf;

/// A plugin written from NCCL's documented tuner interface: forces Ring/LL with 3 channels for
/// AllReduce of 1 MiB and more, and checks the arguments it is given.
const PLUGIN: &str = r#"
#include <stddef.h>
typedef void (*log_t)(int, unsigned long, const char*, int, const char*, ...);
static int ctx_value = 42;
static int calls = 0;
static int init(size_t nranks, size_t nnodes, log_t log, void** ctx) {
  if (nranks != 4 || nnodes != 1) return 4;
  if (log) log(3, 64, __FILE__, __LINE__, "test tuner up");
  *ctx = &ctx_value;
  return 0;
}
static int get(void* ctx, int coll, size_t nbytes, int npipe, float** table, int na, int np,
#ifndef V3
               int regbuff,
#endif
               int* nch) {
  float (*t)[3] = (float (*)[3])table;
  if (ctx != &ctx_value || na < 2 || np != 3 || npipe < 1) return 3;
  calls++;
  if (coll == 4 && nbytes >= (1 << 20) && t[1][0] >= 0) { t[1][0] = 0.0f; *nch = 3; }
  if (coll == 2) t[1][1] = 0.0f; /* LL128 for AllGather */
  return 0;
}
static int destroy(void* ctx) { return ctx == &ctx_value ? 0 : 3; }
struct tuner {
  const char* name;
  int (*init)(size_t, size_t, log_t, void**);
  void* get;
  int (*destroy)(void*);
};
#ifdef V3
const struct tuner ncclTunerPlugin_v3 = { "test-v3", init, (void*)get, destroy };
#else
const struct tuner ncclTunerPlugin_v4 = { "test-v4", init, (void*)get, destroy };
#endif
"#;

fn build(v3: bool) -> PathBuf {
    let name = if v3 {
        "libnccl-tuner-v3.so"
    } else {
        "libnccl-tuner-v4.so"
    };
    let out = common::plugins::scratch("tuner").join(name);
    common::plugins::shared_library_from_text(PLUGIN, &out, if v3 { &["V3"] } else { &[] })
}

fn tuner(plugin: Option<String>) -> Tuner {
    let s = System::synthetic_h200x4().unwrap();
    let g = graph::search(&s, 1, &Params::default()).unwrap();
    Tuner::new(
        &s,
        &g,
        &TuneParams {
            plugin,
            ..Default::default()
        },
    )
}

#[test]
fn plugin_v4_and_v3_steer_the_choice() {
    for v3 in [false, true] {
        let lib = build(v3);
        let t = tuner(Some(lib.display().to_string()));
        let c = t.choose(Coll::AllReduce, 1 << 30).unwrap();
        assert_eq!(
            (c.algo, c.proto, c.nchannels),
            (Algo::Ring, Proto::Ll, 3),
            "v3={v3}"
        );
        // Below the plugin's threshold the model decides.
        let c = t.choose(Coll::AllReduce, 8).unwrap();
        assert_eq!(c.proto, Proto::Ll);
        let c = t.choose(Coll::AllGather, 8).unwrap();
        assert_eq!(c.proto, Proto::Ll128);
        // A combination the model disables stays disabled whatever the plugin writes.
        let c = t.choose(Coll::Broadcast, 1 << 20).unwrap();
        assert_eq!(c.algo, Algo::Ring);
    }
}

#[test]
fn missing_plugin_falls_back_to_the_model() {
    let t = tuner(Some("/nonexistent/libnccl-tuner-none.so".into()));
    let c = t.choose(Coll::AllReduce, 8).unwrap();
    assert_eq!(c.proto, Proto::Ll);
    let t = tuner(Some("none".into()));
    assert_eq!(t.choose(Coll::AllReduce, 8).unwrap().algo, Algo::Ring);
}
