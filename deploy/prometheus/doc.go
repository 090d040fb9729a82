// Package prometheus holds jetsink's Prometheus alerting rules
// (alerts.yml) and their tests. It is a module of its own, so that
// Prometheus's packages, which the tests evaluate the rules with, stay out
// of jetsink's go.mod.
package prometheus
