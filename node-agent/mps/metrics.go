// SPDX-License-Identifier: Apache-2.0

package mps

import "github.com/prometheus/client_golang/prometheus"

var (
	descUp = prometheus.NewDesc("tessera_mps_daemon_up", "1 while the GPU's MPS control daemon answers its health checks.",
		[]string{"UUID"}, nil)
	descRestarts = prometheus.NewDesc("tessera_mps_daemon_failures_total", "Failures (start failure, exit, no answer) of the GPU's MPS control daemon; each is followed by a restart.",
		[]string{"UUID"}, nil)
	descServerFailures = prometheus.NewDesc("tessera_mps_server_failures_total", "MPS servers on the GPU that exited while they had clients.",
		[]string{"UUID"}, nil)
	descClients = prometheus.NewDesc("tessera_mps_clients", "Client processes of the GPU's MPS servers at the last health check.",
		[]string{"UUID"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Supervisor) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descRestarts, descServerFailures, descClients} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the series are read from Status at
// scrape time.
func (s *Supervisor) Collect(ch chan<- prometheus.Metric) {
	for _, st := range s.Status() {
		up, clients := 0.0, 0
		if st.Up {
			up = 1
		}
		for _, c := range st.Servers {
			clients += len(c)
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, st.GPU)
		ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(st.Restarts), st.GPU)
		ch <- prometheus.MustNewConstMetric(descServerFailures, prometheus.CounterValue, float64(st.ServerFailures), st.GPU)
		ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(clients), st.GPU)
	}
}
