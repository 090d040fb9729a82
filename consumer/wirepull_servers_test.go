package consumer

import (
	"slices"
	"testing"
)

// nats.go adds port 4222 to a nats.url entry that has none, and its pool
// (Servers) gives the server so: the entry's credentials must still be
// found for it. Before, they were looked up by the entry's bare host, and
// wire dialled the fallback server without them (Authorization Violation
// on a rolling restart's lame duck step). An empty port ("n3:") is no
// port, as for nats.go; host names match whatever their case.
func TestOtherServersFindTheCredentialsOfAURLWithoutPort(t *testing.T) {
	pool := []string{"nats://n1:4222", "nats://n2:4222", "tls://n3:4222", "nats://n4:4222", "nats://10.0.0.5:4222"}
	configured := "nats://alice:pw@n1,nats://bob:pw@N2, tls://carol:pw@n3:,nats://n4"
	got := otherServers("nats://alice:pw@n1:4222", pool, nil, configured)
	want := []string{"nats://bob:pw@n2:4222", "tls://carol:pw@n3:4222", "nats://n4:4222", "nats://10.0.0.5:4222"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// nats.go checks the certificate of a server it learned of by IP against
// the configured host name, but that of a server nats.url gives by IP
// against the IP itself; wire must check what nats.go checks. Before,
// every IP-addressed server was checked against nats.url's first host
// name.
func TestWireOptionsServerNameOnlyForALearnedIP(t *testing.T) {
	c := &Consumer{cfg: Config{URL: "tls://nats.example:4222, tls://10.0.0.2,tls://10.0.0.3:4333"}}
	for _, tc := range []struct{ connected, want string }{
		{"tls://10.0.0.2:4222", ""},             // in nats.url, without its port
		{"tls://10.0.0.3:4333", ""},             // in nats.url
		{"tls://10.0.0.3:4222", "nats.example"}, // another port: another server, learned
		{"tls://10.0.0.4:4222", "nats.example"}, // learned
		{"tls://nats.example:4222", ""},         // a name is checked as it is
	} {
		o, err := c.wireOptions(tc.connected)
		if err != nil {
			t.Fatalf("%s: %v", tc.connected, err)
		}
		if o.ServerName != tc.want {
			t.Errorf("connected to %s: ServerName %q, want %q", tc.connected, o.ServerName, tc.want)
		}
	}
}
