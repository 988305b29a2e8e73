#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
int main(){ size_t n = (512ul<<20)/4; float* a = aligned_alloc(64, n*4); for(size_t i=0;i<n;i++) a[i]=1.0f;
 for (int rep=0; rep<5; rep++){ double t=omp_get_wtime(); float tot=0;
 #pragma omp parallel reduction(+:tot)
 { __m512 s0=_mm512_setzero_ps(), s1=_mm512_setzero_ps(), s2=_mm512_setzero_ps(), s3=_mm512_setzero_ps();
   #pragma omp for
   for(size_t i=0;i<n;i+=64){ s0=_mm512_add_ps(s0,_mm512_load_ps(a+i)); s1=_mm512_add_ps(s1,_mm512_load_ps(a+i+16)); s2=_mm512_add_ps(s2,_mm512_load_ps(a+i+32)); s3=_mm512_add_ps(s3,_mm512_load_ps(a+i+48)); }
   tot += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0,s1),_mm512_add_ps(s2,s3))); }
 double dt=omp_get_wtime()-t; printf("threads %d: %.1f GB/s (%f)\n", omp_get_max_threads(), n*4/dt/1e9, tot);} }
