(function(){var tip=document.getElementById('tip');
function show(g){var t=g.querySelector('title');if(!t)return;tip.textContent=t.textContent;
var links=(g.getAttribute('data-links')||'').split(' ').filter(Boolean);
if(links.length){var p=document.createElement('div');links.forEach(function(id){if(!document.getElementById(id))return;
var a=document.createElement('a');a.href='#'+id;a.textContent=id.replace(/^ev-/,'evidence ').replace(/^inc-/,'incident ')
.replace(/^knob-/,'knob ');p.appendChild(a);});tip.appendChild(p);}tip.hidden=false;}
function target(e){return e.target.closest?e.target.closest('.mark,.span,.point,.anomaly'):null;}
document.addEventListener('mouseover',function(e){var g=target(e);if(g)show(g);});
document.addEventListener('focusin',function(e){var g=target(e);if(g)show(g);});
document.addEventListener('keydown',function(e){if(e.key==='Escape')tip.hidden=true;});})();
