package ctl

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/board"
)

// The picture of replay -picture: one panel per rung, each the observed
// tail drawn as the share of values above x (a survival curve, its y axis
// logarithmic so that the last few values stay visible), every candidate a
// vertical line labelled with its value and false reaps (the configured
// one drawn distinct), and each lost one a mark on the x axis. Where a
// candidate's line meets the curve is the share of values it would have
// reaped. The SVG is written by hand with encoding/xml; its elements carry
// classes (tail, threshold, configured, threshold-label, lost) so that
// tools, and tests, can read it back.

// Geometry of the picture.
const (
	pictureWidth  = 900
	headHeight    = 40  // the picture's title
	panelHeight   = 340 // a replayed rung's panel
	plotLeft      = 80
	plotRight     = pictureWidth - 30
	plotTopPad    = 100 // the panel's title, its counts, and four rows of candidate labels
	plotBottomPad = 45  // the x axis and its labels
	labelRows     = 4
)

// node is one SVG element.
type node struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Kids    []*node
}

func el(name string, attrs ...string) *node {
	n := &node{XMLName: xml.Name{Local: name}}
	for i := 0; i+1 < len(attrs); i += 2 {
		n.Attrs = append(n.Attrs, xml.Attr{Name: xml.Name{Local: attrs[i]}, Value: attrs[i+1]})
	}
	return n
}

func (n *node) add(kids ...*node) *node {
	n.Kids = append(n.Kids, kids...)
	return n
}

func text(x, y float64, s string, attrs ...string) *node {
	t := el("text", append([]string{"x", num(x), "y", num(y)}, attrs...)...)
	t.Text = s
	return t
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// picture draws the results.
func picture(window time.Duration, results []*rungResult) ([]byte, error) {
	height := headHeight + panelHeight*len(results)
	svg := el("svg", "xmlns", "http://www.w3.org/2000/svg", "width", strconv.Itoa(pictureWidth),
		"height", strconv.Itoa(height), "viewBox", fmt.Sprintf("0 0 %d %d", pictureWidth, height),
		"font-family", "sans-serif", "font-size", "11")
	svg.add(el("rect", "width", "100%", "height", "100%", "fill", "white"))
	head := "replay: the whole history"
	if window > 0 {
		head = "replay: the last " + human(window)
	}
	svg.add(text(plotLeft, 24, head+" — the share of values above each duration, the candidates drawn on it",
		"font-size", "14", "class", "title"))
	top := headHeight
	for _, r := range results {
		svg.add(panel(r, float64(top)))
		top += panelHeight
	}
	var b bytes.Buffer
	b.WriteString(xml.Header)
	enc := xml.NewEncoder(&b)
	enc.Indent("", " ")
	if err := enc.Encode(svg); err != nil {
		return nil, fmt.Errorf("draw the picture: %w", err)
	}
	b.WriteString("\n")
	return b.Bytes(), nil
}

// panel draws one rung at vertical offset top.
func panel(r *rungResult, top float64) *node {
	g := el("g", "class", "rung", "data-rung", r.def.name, "data-status", r.status)
	g.add(text(plotLeft, top+20, rungTitle(r)+" — "+r.def.measure[:indexOr(r.def.measure, ':')], "font-size", "13", "font-weight", "bold"))
	y0, y1 := top+plotTopPad, top+panelHeight-plotBottomPad // plot top and bottom
	g.add(text(plotLeft, top+36, fmt.Sprintf("%s that later proved alive: %d (the curve); %s settled lost: %d "+
		"(the orange marks, at the value they were settled at)", r.def.values, r.rep.Count, r.def.unit, len(r.rep.Lost)),
		"fill", "#444", "class", "counts"))

	// The x axis spans every value drawn: observed, candidates, lost.
	xMax := time.Duration(0)
	if top, ok := r.largest(); ok {
		xMax = top.Value
	}
	for _, c := range r.cands {
		xMax = max(xMax, c.value)
	}
	for _, l := range r.rep.Lost {
		xMax = max(xMax, l.Value)
	}
	xMax = xMax + xMax/12
	if xMax <= 0 {
		xMax = time.Second
	}
	x := func(d time.Duration) float64 {
		return plotLeft + (plotRight-plotLeft)*float64(d)/float64(xMax)
	}
	// The y axis: the share above, from 1 down to a decade under 1/count.
	decades := 1
	if n := r.rep.Count; n > 1 {
		decades = int(math.Ceil(math.Log10(float64(n)))) + 1
	}
	y := func(share float64) float64 {
		lo := math.Pow(10, -float64(decades))
		share = max(share, lo)
		return y0 + (y1-y0)*(-math.Log10(share))/float64(decades)
	}
	axes := el("g", "class", "axes", "stroke", "#888", "fill", "none")
	axes.add(el("line", "x1", num(plotLeft), "y1", num(y1), "x2", num(plotRight), "y2", num(y1)))
	axes.add(el("line", "x1", num(plotLeft), "y1", num(y0), "x2", num(plotLeft), "y2", num(y1)))
	g.add(axes)
	for _, t := range durationTicks(xMax) {
		g.add(el("line", "x1", num(x(t)), "y1", num(y1), "x2", num(x(t)), "y2", num(y1+4), "stroke", "#888"))
		g.add(text(x(t), y1+16, human(t), "text-anchor", "middle", "class", "tick"))
	}
	for d := 0; d <= decades; d++ {
		share := math.Pow(10, -float64(d))
		g.add(el("line", "x1", num(plotLeft-4), "y1", num(y(share)), "x2", num(plotLeft), "y2", num(y(share)), "stroke", "#888"))
		g.add(text(plotLeft-6, y(share)+4, percent(share), "text-anchor", "end", "class", "tick"))
	}
	g.add(text(plotLeft+(plotRight-plotLeft)/2, y1+34, r.def.measure[:indexOr(r.def.measure, ':')], "text-anchor", "middle"))

	if r.rep.Count == 0 {
		g.add(text(plotLeft+10, y0+20, "nothing observed in the window: no "+r.def.unit+" to judge a threshold by",
			"class", "empty"))
	} else {
		g.add(el("polyline", "class", "tail", "fill", "none", "stroke", "#333", "stroke-width", "1.5",
			"points", tailPoints(r.rep, x, y)))
	}
	for _, l := range r.rep.Lost {
		c := el("circle", "class", "lost", "cx", num(x(l.Value)), "cy", num(y1-4), "r", "3", "fill", "#ff7f0e")
		c.add(&node{XMLName: xml.Name{Local: "title"}, Text: fmt.Sprintf("%s: lost, %s %s", obsName(l.Attempt),
			r.def.lostAs, human(l.Value))})
		g.add(c)
	}
	for i, c := range r.cands {
		class, stroke, width, dash := "threshold", "#1f77b4", "1", "4 3"
		label := human(c.value)
		if c.configured {
			class, stroke, width, dash = "threshold configured", "#d62728", "2.5", "none"
			label += " (configured)"
		}
		if r.rep.Count > 0 {
			label += fmt.Sprintf(": %s", plural(c.falseReaps, "false reap"))
		}
		g.add(el("line", "class", class, "data-seconds", strconv.FormatFloat(c.value.Seconds(), 'f', -1, 64),
			"x1", num(x(c.value)), "y1", num(y0-4), "x2", num(x(c.value)), "y2", num(y1),
			"stroke", stroke, "stroke-width", width, "stroke-dasharray", dash))
		lx, anchor := x(c.value)+3, "start"
		if lx > plotRight-160 {
			lx, anchor = x(c.value)-3, "end"
		}
		ly := y0 - 8 - float64(i%labelRows)*12
		g.add(text(lx, ly, label, "class", "threshold-label", "text-anchor", anchor, "data-seconds",
			strconv.FormatFloat(c.value.Seconds(), 'f', -1, 64), "fill", stroke))
	}
	return g
}

func singular(unit string) string {
	if len(unit) > 0 && unit[len(unit)-1] == 's' {
		return unit[:len(unit)-1]
	}
	return unit
}

func indexOr(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return len(s)
}

// percent renders a share of the values: "100%", "1%", "0.01%".
func percent(share float64) string {
	p := share * 100
	if p >= 1 {
		return strconv.FormatFloat(p, 'f', 0, 64) + "%"
	}
	return strconv.FormatFloat(p, 'f', -1, 64) + "%"
}

// tailPoints is the survival curve: the share of values above x, from the
// quantiles and, towards the end, the largest values exactly; a step
// function drawn as steps.
func tailPoints(rep board.Replay, x func(time.Duration) float64, y func(float64) float64) string {
	n := float64(rep.Count)
	type pt struct {
		v     time.Duration
		above float64
	}
	var pts []pt
	fs := pictureQuantiles()
	for i, v := range rep.Quantiles {
		if i >= len(fs) {
			break
		}
		rank := math.Max(1, math.Ceil(fs[i]*n))
		pts = append(pts, pt{v, (n - rank) / n})
	}
	for k, o := range rep.Largest {
		pts = append(pts, pt{o.Value, float64(k) / n})
	}
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].v != pts[j].v {
			return pts[i].v < pts[j].v
		}
		return pts[i].above < pts[j].above
	})
	var b bytes.Buffer
	prev := 1.0
	fmt.Fprintf(&b, "%s,%s", num(x(0)), num(y(1)))
	for i, p := range pts {
		if i > 0 && p.v == pts[i-1].v {
			continue // the smallest share at a value is its first
		}
		fmt.Fprintf(&b, " %s,%s %s,%s", num(x(p.v)), num(y(prev)), num(x(p.v)), num(y(p.above)))
		prev = p.above
	}
	return b.String()
}

// durationTicks are about five round durations under max.
func durationTicks(maxD time.Duration) []time.Duration {
	steps := []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second,
		2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute,
		2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
		2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if maxD/s <= 6 {
			step = s
			break
		}
	}
	var ts []time.Duration
	for t := time.Duration(0); t <= maxD; t += step {
		ts = append(ts, t)
	}
	return ts
}
