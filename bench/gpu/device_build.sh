# Sourced by the run_on_device.sh scripts of bench/gpu/results on the GPU
# machine, from the repository root: starts the device kit's PostgreSQL
# (.device, carried), builds the extension linked with the kernels of
# build-gpu (carried, else built here first) and installs it; exits on
# failure.
bash .device/pg-up.sh > /tmp/pgup.log 2>&1 || { cat /tmp/pgup.log; exit 1; }
. /opt/pg/env.sh
GPU_LIB=$PWD/build-gpu/gpu/libgpu_ivfpq_gpu.a
t0=$(date +%s)
# No kernels carried (room for data in what travels): built here.
if [ ! -s "$GPU_LIB" ]; then
  { cmake -S . -B build-gpu -DGPU_IVFPQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release &&
    cmake --build build-gpu -j"$(nproc)" --target gpu_ivfpq_gpu; } > /tmp/build-gpu.log 2>&1 || { tail -30 /tmp/build-gpu.log; exit 1; }
  echo "kernels built in $(( $(date +%s) - t0 )) s"
fi
( make -s -j"$(nproc)" PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB &&
  make -s install PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB ) > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "extension built in $(( $(date +%s) - t0 )) s"
