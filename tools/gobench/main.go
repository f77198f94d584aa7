// gobench: single-goroutine ChaCha20-Poly1305 seal throughput with golang.org/x/crypto,
// the AEAD package wireguard-go uses. Run it with the same GODEBUG a lab node gets so x/sys/cpu
// sees the same (masked) features. Prints one JSON line.
package main

import (
	"encoding/json"
	"flag"
	"os"
	"syscall"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/sys/cpu"
)

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func main() {
	seconds := flag.Float64("seconds", 1, "how long to run")
	size := flag.Int("bytes", 16384, "message size")
	flag.Parse()
	key := make([]byte, chacha20poly1305.KeySize)
	aead, err := chacha20poly1305.New(key)
	if err != nil {
		panic(err)
	}
	nonce := make([]byte, aead.NonceSize())
	msg := make([]byte, *size)
	dst := make([]byte, 0, *size+aead.Overhead())
	c0, t0 := cpuSeconds(), time.Now()
	deadline := t0.Add(time.Duration(*seconds * float64(time.Second)))
	n := 0
	for time.Now().Before(deadline) {
		for i := 0; i < 16; i++ {
			dst = aead.Seal(dst[:0], nonce, msg, nil)
			n++
		}
	}
	elapsed, cpuS := time.Since(t0).Seconds(), cpuSeconds()-c0
	out := map[string]any{
		"primitive": "go-chacha20-poly1305",
		"bytes":     n * *size,
		"elapsed_s": elapsed,
		"cpu_s":     cpuS,
		"features": map[string]bool{
			"avx2": cpu.X86.HasAVX2, "avx": cpu.X86.HasAVX, "ssse3": cpu.X86.HasSSSE3,
			"aes": cpu.X86.HasAES, "pclmulqdq": cpu.X86.HasPCLMULQDQ, "bmi2": cpu.X86.HasBMI2,
		},
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
