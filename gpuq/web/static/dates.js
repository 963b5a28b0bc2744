// The dashboard's one date format, on every page: YYYY-MM-DD HH:MM in the browser's time zone.

const two = (n) => String(n).padStart(2, "0");

/** Unix seconds as the dashboard writes a moment ("" for none). */
export function when(seconds) {
  if (!seconds) return "";
  const d = new Date(Number(seconds) * 1000);
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}`;
}
