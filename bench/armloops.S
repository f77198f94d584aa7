@ UnixBench 5.1.3's System Call Overhead and Pipe Throughput loops, for the counted guest of
@ bench/kernel_dataplane.py (ARM EABI, static, no libc): `armloops s N` runs N loops of
@ close(dup(0)), getpid, getuid, umask(022); `armloops p N` N loops of a 512-byte write and read
@ on one pipe. Syscall numbers: arch/arm/tools/syscall.tbl.
	.syntax unified
	.arm
	.text
	.global _start
_start:
	ldr	r0, [sp]		@ argc
	cmp	r0, #3
	bne	fail
	ldr	r5, [sp, #8]		@ argv[1]: "s" or "p"
	ldrb	r5, [r5]
	ldr	r1, [sp, #12]		@ argv[2]: the loop count
	mov	r4, #0
	mov	r3, #10
parse:
	ldrb	r2, [r1], #1
	cmp	r2, #0
	beq	parsed
	sub	r2, r2, #48
	mla	r4, r4, r3, r2
	b	parse
parsed:
	cmp	r4, #0
	beq	fail
	cmp	r5, #115		@ 's'
	beq	sysloop
	cmp	r5, #112		@ 'p'
	beq	pipeloop
fail:
	mov	r0, #2
	mov	r7, #248		@ exit_group
	svc	#0

sysloop:
	mov	r0, #0
	mov	r7, #41			@ dup
	svc	#0
	mov	r7, #6			@ close (the new fd in r0)
	svc	#0
	mov	r7, #20			@ getpid
	svc	#0
	mov	r7, #199		@ getuid32 (glibc's getuid)
	svc	#0
	mov	r0, #18			@ 022
	mov	r7, #60			@ umask
	svc	#0
	subs	r4, r4, #1
	bne	sysloop
	b	done

pipeloop:
	ldr	r0, =fds
	mov	r7, #42			@ pipe
	svc	#0
	cmp	r0, #0
	bne	fail
	ldr	r8, =fds
	ldr	r5, [r8]		@ read end
	ldr	r6, [r8, #4]		@ write end
	ldr	r8, =buf
1:
	mov	r0, r6
	mov	r1, r8
	mov	r2, #512
	mov	r7, #4			@ write
	svc	#0
	cmp	r0, #512
	bne	fail
	mov	r0, r5
	mov	r1, r8
	mov	r2, #512
	mov	r7, #3			@ read
	svc	#0
	cmp	r0, #512
	bne	fail
	subs	r4, r4, #1
	bne	1b
done:
	mov	r0, #0
	mov	r7, #248
	svc	#0

	.bss
	.align	3
fds:	.space	8
buf:	.space	512
