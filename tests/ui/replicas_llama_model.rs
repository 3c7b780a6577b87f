// `Replicas` sends each pass to whichever replica is free. A decoder keeps per-sequence state (its
// KV cache) between passes, so a sequence's later steps could land on a replica that does not hold
// its cache and answer wrongly without an error. `LlamaModel` is therefore not `Replicable`, and
// `Replicas<LlamaModel>` is refused. (`GraphMlp`, stateless, is accepted: see
// `pass_replicas_mlp.rs`.)

use cuda_async::Replicas;
use models::llama::LlamaModel;

fn serve(models: Vec<LlamaModel>) -> cuda_async::Result<Replicas<LlamaModel>> {
    Replicas::new(models)
}

fn main() {
    let _ = serve(Vec::new());
}
