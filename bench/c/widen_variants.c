/* Ways to widen stored weights and multiply-add them, timed on this core (issue #47): which conversion bounds
 * 16-bit and 8-bit weights. Each kernel: 32 inputs x 8 vectors of 16 outputs, accumulators in registers, the
 * stored weights L1-resident, so the loop measures the core's issue rate, not a cache. Prints ns per pass and
 * float32 multiply-add lanes per ns (the float32 row: the same loop on float32 weights, 16 KiB). The rows
 * time the instruction mixes of exact widenings (the values are not checked here: the kernel's own are, by
 * tests/test_weights.py), except "dpbf16", which rounds the activations to bf16 too (shown for its rate).
 *
 *   gcc -O3 -march=x86-64-v4 -mavx512bf16 -o /tmp/widen bench/c/widen_variants.c && taskset -c 1 /tmp/widen
 *
 * Results on each machine kind: docs/benchmarks.md ("Narrow weights at their floor"). */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static inline uint64_t ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
#define N_IN 32
#define NB 8
/* each kernel: for i in n_in: x broadcast; for q in NB: acc[q] += x * LD(w + i*NB*16 + q*16) */
static float xs[N_IN] __attribute__((aligned(64)));
static float wf[N_IN*NB*16] __attribute__((aligned(64)));
static uint16_t wh[N_IN*NB*16] __attribute__((aligned(64)));
static int8_t wq[N_IN*NB*16] __attribute__((aligned(64)));
static float out[NB*16] __attribute__((aligned(64)));
#define KERNEL(name, LOADEXPR, PRE) \
__attribute__((noinline)) void name(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps(); \
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]) PRE; for(int q=0;q<NB;q++){ size_t o=(size_t)i*NB*16+q*16; __m512 w=LOADEXPR; acc[q]=_mm512_fmadd_ps(x,w,acc[q]);} } \
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }
KERNEL(k_f32, _mm512_load_ps(wf+o), )
KERNEL(k_f16, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(wh+o))), )
KERNEL(k_bf16, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i*)(wh+o))),16)), )
KERNEL(k_f16int, _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_load_si256((const __m256i*)(wh+o))),13),_mm512_set1_epi32((int)0x8FFFE000))), )
KERNEL(k_int8, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i*)(wq+o)))), )
/* bf16 paired: 32 weights in one zmm (16 pairs); even = <<16, odd = & 0xffff0000; NB/2 loads */
__attribute__((noinline)) void k_bf16pair(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  const __m512i m=_mm512_set1_epi32((int)0xffff0000);
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]); for(int q=0;q<NB;q+=2){ size_t o=(size_t)i*NB*16+q*16; __m512i v=_mm512_load_si512((const void*)(wh+o));
   acc[q]=_mm512_fmadd_ps(x,_mm512_castsi512_ps(_mm512_slli_epi32(v,16)),acc[q]); acc[q+1]=_mm512_fmadd_ps(x,_mm512_castsi512_ps(_mm512_and_si512(v,m)),acc[q+1]);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }
/* f16 paired via integer: pairs in a zmm: even = (v<<16)>>? ... use: lo = slli(v,16) then srai? do sign-ext trick per half */
__attribute__((noinline)) void k_f16pair(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  const __m512i m=_mm512_set1_epi32((int)0x8FFFE000);
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]); for(int q=0;q<NB;q+=2){ size_t o=(size_t)i*NB*16+q*16; __m512i v=_mm512_load_si512((const void*)(wh+o));
   __m512i lo=_mm512_srai_epi32(_mm512_slli_epi32(v,16),3); __m512i hi=_mm512_srai_epi32(v,3);
   acc[q]=_mm512_fmadd_ps(x,_mm512_castsi512_ps(_mm512_and_si512(lo,m)),acc[q]); acc[q+1]=_mm512_fmadd_ps(x,_mm512_castsi512_ps(_mm512_and_si512(hi,m)),acc[q+1]);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }
__attribute__((noinline)) void k_dpbf16(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  for(int i=0;i<N_IN;i+=2){ __m512bh x=(__m512bh)_mm512_set1_epi32(*(int*)(wh+i)); for(int q=0;q<NB;q++){ size_t o=(size_t)i*NB*16+q*32; __m512bh w=(__m512bh)_mm512_load_si512((const void*)(wh+o)); acc[q]=_mm512_dpbf16_ps(acc[q],x,w);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }

__attribute__((noinline)) void k_int8quad(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]); for(int q=0;q<NB;q+=4){ size_t o=(size_t)i*NB*16+q*16; __m512i v=_mm512_load_si512((const void*)(wq+o));
   acc[q]=_mm512_fmadd_ps(x,_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v,24),24)),acc[q]);
   acc[q+1]=_mm512_fmadd_ps(x,_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v,16),24)),acc[q+1]);
   acc[q+2]=_mm512_fmadd_ps(x,_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v,8),24)),acc[q+2]);
   acc[q+3]=_mm512_fmadd_ps(x,_mm512_cvtepi32_ps(_mm512_srai_epi32(v,24)),acc[q+3]);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }

__attribute__((noinline)) void k_int8shuf(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  /* each 128-bit lane k takes bytes 4k..4k+3 of the 16 broadcast into the top byte of its dwords */
  const __m512i idx=_mm512_set_epi32(0x0f808080,0x0e808080,0x0d808080,0x0c808080, 0x0b808080,0x0a808080,0x09808080,0x08808080,
      0x07808080,0x06808080,0x05808080,0x04808080, 0x03808080,0x02808080,0x01808080,0x00808080);
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]); for(int q=0;q<NB;q++){ size_t o=(size_t)i*NB*16+q*16;
   __m512i v=_mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)(wq+o)));
   acc[q]=_mm512_fmadd_ps(x,_mm512_cvtepi32_ps(_mm512_shuffle_epi8(v,idx)),acc[q]);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }
__attribute__((noinline)) void k_f16ymm(void){ __m256 acc[2*NB]; for(int q=0;q<2*NB;q++) acc[q]=_mm256_setzero_ps();
  for(int i=0;i<N_IN;i++){ __m256 x=_mm256_set1_ps(xs[i]); for(int q=0;q<2*NB;q++){ size_t o=(size_t)i*NB*16+q*8;
   acc[q]=_mm256_fmadd_ps(x,_mm256_cvtph_ps(_mm_load_si128((const __m128i*)(wh+o))),acc[q]);} }
  for(int q=0;q<2*NB;q++) _mm256_store_ps(out+q*8,acc[q]); }
__attribute__((noinline)) void k_int8magic(void){ __m512 acc[NB]; for(int q=0;q<NB;q++) acc[q]=_mm512_setzero_ps();
  const __m512i ff=_mm512_set1_epi32(0xff), mg=_mm512_set1_epi32(0x4B000000); const __m512 off=_mm512_set1_ps(8388608.0f+128.0f);
  for(int i=0;i<N_IN;i++){ __m512 x=_mm512_set1_ps(xs[i]); for(int q=0;q<NB;q+=4){ size_t o=(size_t)i*NB*16+q*16; __m512i v=_mm512_load_si512((const void*)(wq+o));
   __m512i b0=_mm512_ternarylogic_epi32(v,ff,mg,0xEA); /* (a&b)|c */
   __m512i b1=_mm512_ternarylogic_epi32(_mm512_srli_epi32(v,8),ff,mg,0xEA);
   __m512i b2=_mm512_ternarylogic_epi32(_mm512_srli_epi32(v,16),ff,mg,0xEA);
   __m512i b3=_mm512_or_si512(_mm512_srli_epi32(v,24),mg);
   acc[q]=_mm512_fmadd_ps(x,_mm512_sub_ps(_mm512_castsi512_ps(b0),off),acc[q]);
   acc[q+1]=_mm512_fmadd_ps(x,_mm512_sub_ps(_mm512_castsi512_ps(b1),off),acc[q+1]);
   acc[q+2]=_mm512_fmadd_ps(x,_mm512_sub_ps(_mm512_castsi512_ps(b2),off),acc[q+2]);
   acc[q+3]=_mm512_fmadd_ps(x,_mm512_sub_ps(_mm512_castsi512_ps(b3),off),acc[q+3]);} }
  for(int q=0;q<NB;q++) _mm512_store_ps(out+q*16,acc[q]); }
typedef void (*fn)(void);
static double bench(fn f){ double best=1e30; for(int r=0;r<200;r++){ uint64_t t=ns(); for(int k=0;k<100;k++) f(); double d=(ns()-t)/100.0; if(d<best) best=d;} return best; }
int main(){ for(int i=0;i<N_IN;i++) xs[i]=0.01f*i; for(int i=0;i<N_IN*NB*16;i++){wf[i]=0.001f*(i%97); wh[i]=0x3c00+(i%50); wq[i]=i%100;}
 struct {const char*n; fn f;} ks[]={{"f32",k_f32},{"f16 cvtph2ps",k_f16},{"bf16 zx+shift",k_bf16},{"f16 int sx+shl+and",k_f16int},{"int8 sx+cvtdq2ps",k_int8},{"bf16 pair shl/and",k_bf16pair},{"f16 pair int",k_f16pair},{"dpbf16 (32 w/op)",k_dpbf16},{"int8 quad",k_int8quad},{"int8 quad magic",k_int8magic},{"int8 bcast+pshufb",k_int8shuf},{"f16 ymm cvt+ymm fma",k_f16ymm}};
 double fmas=(double)N_IN*NB*16;
 for(int rep=0;rep<2;rep++) for(int j=0;j<(int)(sizeof ks/sizeof ks[0]);j++){ double t=bench(ks[j].f); printf("%-22s %8.1f ns  %.2f FMA(lanes)/ns\n",ks[j].n,t,fmas/t);} }
