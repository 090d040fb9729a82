package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// A status as Linux 6.x writes it: the memory lines among the others.
const statusText = `Name:	jetsink
Umask:	0022
State:	S (sleeping)
Pid:	4242
VmPeak:	 1265880 kB
VmSize:	 1265880 kB
VmLck:	       0 kB
VmHWM:	   64204 kB
VmRSS:	   61000 kB
RssAnon:	   36000 kB
RssFile:	   24900 kB
RssShmem:	     100 kB
VmData:	  120000 kB
Threads:	9
`

func TestParseMemStatus(t *testing.T) {
	m, ok := parseMemStatus([]byte(statusText))
	want := memStatus{rss: 61000 << 10, hwm: 64204 << 10, anon: 36000 << 10, file: 24900 << 10, shmem: 100 << 10, split: true}
	if !ok || m != want {
		t.Errorf("parsed %+v, %v; want %+v", m, ok, want)
	}
	// A kernel before 4.5 has no Rss* lines: VmRSS and VmHWM, not split.
	old := strings.NewReplacer("RssAnon:", "X:", "RssFile:", "Y:", "RssShmem:", "Z:").Replace(statusText)
	if m, ok := parseMemStatus([]byte(old)); !ok || m.split || m.rss != 61000<<10 || m.hwm != 64204<<10 || m.anon != 0 {
		t.Errorf("without Rss* lines: %+v, %v; want VmRSS and VmHWM only, not split", m, ok)
	}
	// A zombie's status has no memory lines: nothing read.
	if _, ok := parseMemStatus([]byte("Name:\tx\nState:\tZ (zombie)\n")); ok {
		t.Error("a status without VmRSS parsed")
	}
	if _, ok := parseMemStatus([]byte("VmRSS:\tlots kB\n")); ok {
		t.Error("a VmRSS that is no number parsed")
	}

	// This process's own: the parts add up to VmRSS (the kernel sums the
	// same counters), and a Go program's heap is anonymous.
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("this test reads /proc/self/status (Linux): %v", err)
	}
	m, ok = parseMemStatus(b)
	if !ok || !m.split || m.anon <= 0 || m.file <= 0 || m.anon+m.file+m.shmem != m.rss || m.hwm < m.rss {
		t.Errorf("/proc/self/status parsed as %+v (%v):\n%s", m, ok, b)
	}
}

// MemPeaks keeps each part's own peak, and RssFile in the sample of the
// anon peak.
func TestMemPeaks(t *testing.T) {
	var p MemPeaks
	for _, m := range []memStatus{
		{anon: 10, file: 30, shmem: 1},
		{anon: 40, file: 20, shmem: 0}, // the anon peak
		{anon: 30, file: 35, shmem: 2}, // the file peak
	} {
		p.add(m)
	}
	if want := (MemPeaks{Anon: 40, FileAtAnon: 20, File: 35, Shmem: 2}); p != want {
		t.Errorf("peaks %+v, want %+v", p, want)
	}
}

// A sampler whose child has exited reads nothing, at its start or at its
// stop: the PID, reaped, may be another process's (here it is this test's,
// which a read would count).
func TestMemSamplerReadsNothingOnceExited(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	s := sampleMem(os.Getpid(), time.Hour, exited)
	if peaks, hwm := s.stop(); peaks != (MemPeaks{}) || hwm != 0 {
		t.Errorf("peaks %+v, VmHWM %d after the exit; want none read", peaks, hwm)
	}
	// Not exited: this process is read.
	s = sampleMem(os.Getpid(), time.Hour, make(chan struct{}))
	if peaks, hwm := s.stop(); peaks.Anon <= 0 || hwm <= 0 {
		t.Errorf("peaks %+v, VmHWM %d of a live process; want them read", peaks, hwm)
	}
}

// checkMemParts checks a real run's memory parts against its VmHWM: each
// sample's parts add up to its VmRSS, which VmHWM is at least, so the anon
// peak and the RssFile beside it are at most VmHWM (up to the kernel's
// per-CPU counting slack), and the two peaks together are not far below
// it (a sample every 25 ms may miss a short spike, not half of it). The
// JSON carries them.
func checkMemParts(t *testing.T, rep *Report) {
	t.Helper()
	for _, r := range rep.Results {
		anon, file, hwm := r.RSSAnonMax, r.RSSFileMax, r.PeakRSS
		if anon <= 0 || file <= 0 || r.RSSFileAtAnonMax <= 0 || r.RSSFileAtAnonMax > file {
			t.Errorf("%s: RssAnon peak %d, RssFile %d at it, RssFile peak %d", r.Engine, anon, r.RSSFileAtAnonMax, file)
			continue
		}
		if at := anon + r.RSSFileAtAnonMax; at > hwm+hwm/50 || anon+file < hwm/2 || file > hwm+hwm/50 {
			t.Errorf("%s: RssAnon peak %.1f MiB + RssFile at it %.1f (its peak %.1f) against VmHWM %.1f",
				r.Engine, mib(anon), mib(r.RSSFileAtAnonMax), mib(file), mib(hwm))
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, r := range got.Results {
		for _, k := range []string{"peak_rss_bytes", "rss_anon_max_bytes", "rss_file_at_anon_max_bytes", "rss_file_max_bytes"} {
			if v, _ := r[k].(float64); v <= 0 {
				t.Errorf("%v: JSON %s is %v", r["engine"], k, r[k])
			}
		}
	}
	for _, s := range rep.Summary {
		if s.RSSAnonMiB.N == 0 || s.RSSFileMiB.N == 0 {
			t.Errorf("%s: summary without the RSS parts: %+v", s.Engine, s)
		}
	}
}

// An RSS sampler (the table lock's) whose child has exited reads nothing,
// on its ticks or when marked: the PID may be another process's (here
// this test's).
func TestRSSSamplerReadsNothingOnceExited(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	s := sampleRSS(os.Getpid(), time.Hour, exited)
	s.mark()
	if got := s.stop(); len(got) != 0 {
		t.Errorf("%d samples after the exit; want none", len(got))
	}
	// Not exited: this process is read, at the start and when marked.
	s = sampleRSS(os.Getpid(), time.Hour, make(chan struct{}))
	s.mark()
	if got := s.stop(); len(got) == 0 {
		t.Errorf("no samples of a live process")
	}
}
