"""A table of a built net: layer, type, bottoms, tops with shapes, parameter count and forward FLOPs."""


def _shape(shape):
    return "(" + ",".join(str(d) for d in shape) + ")" if shape else "()"


def net_table(net):
    """Rows (layer, type, bottoms, tops, params, flops) and a totals row; shared params counted once."""
    rows, seen, total_params, total_flops = [], set(), 0, 0
    for layer_id, layer in enumerate(net.layers):
        bottom = [net.blob_list[i] for i in net.bottom_ids[layer_id]]
        top = [net.blob_list[i] for i in net.top_ids[layer_id]]
        params = 0
        for blob in layer.blobs:
            if id(blob) not in seen:
                seen.add(id(blob))
                params += blob.count
        flops = int(layer.flops(bottom, top))
        total_params += params
        total_flops += flops
        rows.append((layer.name, layer.type,
                     " ".join(net.blob_names[i] for i in net.bottom_ids[layer_id]),
                     " ".join("%s%s" % (net.blob_names[i], _shape(net.blob_list[i].shape))
                              for i in net.top_ids[layer_id]),
                     params, flops))
    return rows, total_params, total_flops


def human(n):
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return ("%d" % n if unit == "" else "%.2f%s" % (n, unit))
        n /= 1000.0
    return "%.2fP" % n


def format_table(net):
    rows, total_params, total_flops = net_table(net)
    header = ("layer", "type", "bottoms", "tops (shape)", "params", "FLOPs")
    body = [(r[0], r[1], r[2], r[3], human(r[4]) if r[4] else "-", human(r[5]) if r[5] else "-") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    widths[2], widths[3] = min(widths[2], 40), min(widths[3], 60)
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in body]
    lines.append("%d layers, %s parameters (%d), %s forward FLOPs (%d); inputs: %s; outputs: %s"
                 % (len(rows), human(total_params), total_params, human(total_flops), total_flops,
                    ", ".join(net.blob_names[i] for i in net.input_ids) or "-",
                    ", ".join(net.blob_names[i] for i in net.output_ids) or "-"))
    return "\n".join(lines)
