// Two-thread read bandwidth: 512 MB read with AVX-512 loads by 1 and 2 threads, 4 repetitions each.
// g++ -O2 -mavx512f -pthread bw.cc -o bw && ./bw
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <cstring>
int main(){
  size_t n = 512ull<<20; char* buf=(char*)aligned_alloc(64,n); memset(buf,1,n);
  for(int threads=1;threads<=2;threads++) for(int rep=0;rep<4;rep++){
    auto t0=std::chrono::steady_clock::now();
    std::vector<std::thread> ts; std::vector<float> out(threads);
    for(int t=0;t<threads;t++) ts.emplace_back([&,t]{ size_t s=n/threads*t, e=s+n/threads; __m512 acc=_mm512_setzero_ps(),a2=acc,a3=acc,a4=acc;
      for(size_t i=s;i<e;i+=256){acc=_mm512_add_ps(acc,_mm512_load_ps((float*)(buf+i)));a2=_mm512_add_ps(a2,_mm512_load_ps((float*)(buf+i+64)));a3=_mm512_add_ps(a3,_mm512_load_ps((float*)(buf+i+128)));a4=_mm512_add_ps(a4,_mm512_load_ps((float*)(buf+i+192)));}
      out[t]=_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc,a2),_mm512_add_ps(a3,a4)));});
    for(auto&t:ts)t.join();
    double dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
    printf("threads %d GB/s %.1f (%f)\n",threads,n/dt/1e9,out[0]);
  }
}
