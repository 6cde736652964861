//! `cargo run --release --manifest-path tools/rs-compare/Cargo.toml`: encode and decode
//! (two data shards lost) with `reed-solomon-simd` (GF(2^16), Leopard-style FFT) and
//! `reed-solomon-erasure` (GF(2^8), matrix, `simd-accel`), median of five batches, encoder
//! and decoder objects reused. The value is split into k shards of equal length (a
//! multiple of 64 bytes). Results on the 2-core VM are in the issue 12 notes and will go to
//! docs/benchmarks.md with the erasure coding that uses them.
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    for &(k, m) in &[(3usize, 2usize), (4, 2)] {
        for &size in &[16usize << 10, 64 << 10, 1 << 20] {
            // Shard length: value split in k, rounded up to a multiple of 64 (reed-solomon-simd needs even; 64 for both).
            let shard = size.div_ceil(k).div_ceil(64) * 64;
            let data: Vec<Vec<u8>> = (0..k)
                .map(|i| (0..shard).map(|j| (i * 31 + j * 7) as u8).collect())
                .collect();
            let reps = if size >= 1 << 20 { 200 } else { 2000 };
            // reed-solomon-simd encode
            let mut t_simd = Vec::new();
            let mut t_simd_dec = Vec::new();
            let mut enc = reed_solomon_simd::ReedSolomonEncoder::new(k, m, shard).unwrap();
            let mut dec = reed_solomon_simd::ReedSolomonDecoder::new(k, m, shard).unwrap();
            for _ in 0..5 {
                let s = Instant::now();
                let mut rec: Vec<Vec<u8>> = Vec::new();
                for _ in 0..reps {
                    enc.reset(k, m, shard).unwrap();
                    for d in &data {
                        enc.add_original_shard(d).unwrap();
                    }
                    let r = enc.encode().unwrap();
                    rec = r.recovery_iter().map(|x| x.to_vec()).collect();
                }
                t_simd.push(s.elapsed().as_secs_f64() / reps as f64 * 1e6);
                let s = Instant::now();
                for _ in 0..reps {
                    dec.reset(k, m, shard).unwrap();
                    for i in m..k {
                        dec.add_original_shard(i, &data[i]).unwrap();
                    }
                    for i in 0..m {
                        dec.add_recovery_shard(i, &rec[i]).unwrap();
                    }
                    let r = dec.decode().unwrap();
                    assert_eq!(r.restored_original_iter().count(), m);
                }
                t_simd_dec.push(s.elapsed().as_secs_f64() / reps as f64 * 1e6);
            }
            // reed-solomon-erasure
            let rse = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).unwrap();
            let mut t_rse = Vec::new();
            let mut t_rse_dec = Vec::new();
            for _ in 0..5 {
                let mut shards: Vec<Vec<u8>> = data.clone();
                shards.extend((0..m).map(|_| vec![0u8; shard]));
                let s = Instant::now();
                for _ in 0..reps {
                    rse.encode(&mut shards).unwrap();
                }
                t_rse.push(s.elapsed().as_secs_f64() / reps as f64 * 1e6);
                let s = Instant::now();
                for _ in 0..reps {
                    let mut opt: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
                    for i in 0..m {
                        opt[i] = None;
                    }
                    rse.reconstruct_data(&mut opt).unwrap();
                }
                t_rse_dec.push(s.elapsed().as_secs_f64() / reps as f64 * 1e6);
            }
            println!("RS({k},{m}) {:>7} B: encode simd {:8.1} us  erasure {:8.1} us | decode(2 data lost) simd {:8.1} us  erasure {:8.1} us",
                size, median(t_simd), median(t_rse), median(t_simd_dec), median(t_rse_dec));
        }
    }
}
