// Positive control for `replicas_llama_model.rs`: a stateless module (`GraphMlp`: a pass reads only
// its input and the weights) is `Replicable` and can be served by `Replicas`, from the crate root
// and from `cuda_async::graph`. Compile-only: `main` launches nothing.

use models::mlp::GraphMlp;

fn serve(models: Vec<GraphMlp>) -> cuda_async::Result<cuda_async::Replicas<GraphMlp>> {
    cuda_async::Replicas::new(models)
}

async fn one_pass(r: &cuda_async::graph::Replicas<GraphMlp>, x: Vec<f32>) -> cuda_async::Result<Vec<f32>> {
    r.forward(x).await
}

fn main() {
    let _ = serve(Vec::new());
    let _ = one_pass;
}
