package pipeline_test

import (
	"errors"
	"fmt"

	"github.com/jetsink/jetsink/pipeline"
)

func ExampleCompile() {
	m, err := pipeline.Compile([]pipeline.Column{
		{Name: "id", From: "json:id", Type: pipeline.TypeUUID, Required: true},
		{Name: "site", From: "json:tags.site", Type: pipeline.TypeText},
		{Name: "seq", From: "meta:stream_seq", Type: pipeline.TypeInt8},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	enc := m.NewEncoder(1 << 20) // one per goroutine

	ev := &pipeline.Event{StreamSeq: 42, Data: []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","tags":{"site":"ams-3"}}`)}
	tuple, err := enc.AppendTuple(nil, ev)
	fmt.Printf("%v\n% x\n", err, tuple)

	// A missing required value: the event belongs on the dead-letter subject.
	_, err = enc.AppendTuple(nil, &pipeline.Event{Data: []byte(`{"tags":{}}`)})
	var de *pipeline.DecodeError
	if errors.As(err, &de) {
		fmt.Println(de.Column, de.Code)
	}

	// Mapping errors name the column and the fix.
	_, err = pipeline.Compile([]pipeline.Column{{Name: "n", From: "meta:stream_seq", Type: pipeline.TypeInt4}})
	fmt.Println(errors.Is(err, pipeline.ErrInvalidMapping))
	fmt.Println(err)
	// Output:
	// <nil>
	// 00 03 00 00 00 10 3f 0c 9a 2e 1b 7d 4c 8e 9f 00 01 23 45 67 89 ab 00 00 00 05 61 6d 73 2d 33 00 00 00 08 00 00 00 00 00 00 00 2a
	// id required_missing
	// true
	// invalid column mapping: column 0 ("n"): source "meta:stream_seq" cannot fill a column of type int4; use one of int8, numeric, text
}
