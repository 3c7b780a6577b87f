// Handing wrapped memory back without waiting for its uses is `unsafe`: safe code could drop the
// owner (freeing the memory) while a kernel of ours still writes it. The safe `into_owner` waits.

use cuda_core::DeviceBuffer;

fn hand_back(buf: DeviceBuffer<f32>) {
    let _ = buf.into_owner_unsynced::<()>();
}

fn main() {
    let _ = hand_back;
}
